"""DeepSpeed's flops profiler as a stack: its per-call formulas applied to the calls a model's
forward makes, and its step as a multiple of that forward.

Transcribed from deepspeed 0.19.8 (PyPI), deepspeed/profiling/flops_profiler/profiler.py:
``_patch_functionals`` and ``_patch_tensor_methods`` list the functions it wraps, each with
its ``_*_flops_compute`` formula returning (FLOPs, MACs); ``FlopsProfiler.get_total_flops``
sums them over the modules of one forward; ``print_model_profile`` logs the step as
``(bwd_factor + 1) x`` that forward, ``bwd_factor = 2 + recompute_fwd_factor`` (0.0 unless
the config sets ``flops_profiler.recompute_fwd_factor``, deepspeed/profiling/constants.py).
The profiler only sees calls through the attributes it replaces: an operator (``a + b``)
and a function it does not wrap (``torch.rsqrt``, ``F.cross_entropy``, ``torch._grouped_mm``)
count 0.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from .calls import count_calls
from .parts import matmul_part
from .registry import ModelFacts, NotCovered, stack

DEEPSPEED = "deepspeed 0.19.8 (PyPI)"
PROFILER = "deepspeed/profiling/flops_profiler/profiler.py"

#: ``bwd_factor = 2 + recompute_fwd_factor`` with DeepSpeed's default factor, 0.0.
BACKWARD_FACTOR = 2

#: How a call's FLOPs are split into parts: ``matmul`` (2 x its MACs are the product, the
#: rest, ``addmm``'s bias, elementwise), ``contraction`` (einsum: DeepSpeed returns no MACs,
#: every FLOP is the contraction's), ``elementwise``.
Kind = Literal["matmul", "contraction", "elementwise"]


@dataclass(frozen=True)
class DeepSpeedFormula:
    """One wrapped function's formula: DeepSpeed's ``(flops, macs)`` of its arguments."""

    compute: Callable[..., tuple[int, int]]
    kind: Kind
    name: str
    """The function as DeepSpeed wraps it, e.g. ``F.linear``."""


def _numel(input, *args, **kwargs) -> tuple[int, int]:
    """``_relu_flops_compute``, ``_silu_flops_compute``, ``_gelu_flops_compute``,
    ``_softmax_flops_compute``, ``_pool_flops_compute`` and the other activations: one FLOP
    per input element."""
    return input.numel(), 0


def _norm(input, *args, weight=None, **kwargs) -> tuple[int, int]:
    """``_layer_norm_flops_compute``, ``_group_norm_flops_compute``: ``numel x (5 if affine
    else 4)``; the weight is the third argument of ``F.layer_norm`` and ``F.group_norm``."""
    weight = args[1] if len(args) > 1 else weight
    return input.numel() * (5 if weight is not None else 4), 0


def _instance_norm(input, running_mean=None, running_var=None, weight=None,
                   *args, **kwargs) -> tuple[int, int]:
    """``_instance_norm_flops_compute``."""
    return input.numel() * (5 if weight is not None else 4), 0


def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
                *args, **kwargs) -> tuple[int, int]:
    """``_batch_norm_flops_compute``: training ``numel x (5 if affine else 4)``, else
    ``numel x (2 if affine else 1)``."""
    affine = weight is not None
    if training:
        return input.numel() * (5 if affine else 4), 0
    return input.numel() * (2 if affine else 1), 0


def _embedding(*args, **kwargs) -> tuple[int, int]:
    """``_embedding_flops_compute``: a lookup, 0."""
    return 0, 0


def _linear(input, weight, bias=None) -> tuple[int, int]:
    """``_linear_flops_compute``: ``macs = input.numel() x out_features``; no bias term."""
    macs = input.numel() * weight.shape[0]
    return 2 * macs, macs


def _matmul(input, other, *, out=None) -> tuple[int, int]:
    """``_matmul_flops_compute`` (``matmul``, ``mm``, ``bmm``, ``@``):
    ``prod(input.shape) x other.shape[-1]``."""
    macs = math.prod(input.shape) * other.shape[-1]
    return 2 * macs, macs


def _addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None) -> tuple[int, int]:
    """``_addmm_flops_compute``, ``_tensor_addmm_flops_compute`` (``addmm``, ``baddbmm``):
    the product, plus one FLOP per element of the added tensor as given (a bias of ``out``
    elements adds ``out``, not one per row)."""
    macs = math.prod(mat1.shape) * mat2.shape[-1]
    return 2 * macs + math.prod(input.shape), macs


def _elementwise(input, other, *args, **kwargs) -> tuple[int, int]:
    """``_mul_flops_compute``, ``_add_flops_compute`` (``_elementwise_flops_compute``): the
    elements of the broadcast result; 1 for two scalars."""
    if not torch.is_tensor(input):
        return (math.prod(other.shape), 0) if torch.is_tensor(other) else (1, 0)
    if not torch.is_tensor(other):
        return math.prod(input.shape), 0
    return math.prod(torch.broadcast_shapes(input.shape, other.shape)), 0


def _attention(q, k, v, *args, **kwargs) -> tuple[int, int]:
    """``_attn_flops_compute`` (``F.scaled_dot_product_attention``): q.k over every key and
    p.v, the whole T x T square whatever the mask."""
    macs = math.prod(q.shape) * k.shape[-2]
    macs += math.prod(q.shape[:-1]) * k.shape[-2] * v.shape[-1]
    return 2 * macs, macs


def _einsum(equation, *operands) -> tuple[int, int]:
    """``_einsum_flops_compute``: numpy's ``einsum_path`` "optimized flop" count of the
    equation, its letters renamed in order of appearance."""
    if not all(torch.is_tensor(o) for o in operands):
        raise NotCovered("DeepSpeed's _einsum_flops_compute reads each operand's shape: "
                         "torch.einsum(equation, [operands]) raises there")
    equation = equation.replace(" ", "")
    letters = OrderedDict((k, 0) for k in equation if k.isalpha()).keys()
    equation = equation.translate({ord(x): 97 + i for i, x in enumerate(letters)})
    import numpy as np  # here: `import exportflops` needs no numpy

    arrays = [np.zeros(tuple(o.shape)) for o in operands]
    for line in np.einsum_path(equation, *arrays, optimize="optimal")[1].split("\n"):
        if "optimized flop" in line.lower():
            return int(float(line.split(":")[-1])), 0
    raise NotCovered(f"DeepSpeed's _einsum_flops_compute raises NotImplementedError on "
                     f"torch.einsum({equation!r})")


def _table() -> dict[Callable, DeepSpeedFormula]:
    entries = [(F.linear, _linear, "matmul")]
    entries += [(f, _numel, "elementwise") for f in (
        F.relu, F.prelu, F.elu, F.leaky_relu, F.relu6, F.silu, F.gelu, F.softmax,
        F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d,
        F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
        F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d)]
    entries += [(F.layer_norm, _norm, "elementwise"), (F.group_norm, _norm, "elementwise"),
                (F.instance_norm, _instance_norm, "elementwise"),
                (F.batch_norm, _batch_norm, "elementwise"),
                (F.embedding, _embedding, "elementwise"),
                (F.scaled_dot_product_attention, _attention, "matmul"),
                (torch.einsum, _einsum, "contraction")]
    entries += [(f, _matmul, "matmul") for f in (
        torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
        torch.bmm, torch.Tensor.bmm)]
    entries += [(f, _addmm, "matmul") for f in (torch.addmm, torch.Tensor.addmm,
                                                torch.baddbmm)]
    entries += [(f, _elementwise, "elementwise") for f in (torch.mul, torch.Tensor.mul,
                                                           torch.add, torch.Tensor.add)]
    return {f: DeepSpeedFormula(compute, kind, getattr(f, "__name__", str(f)))
            for f, compute, kind in entries}


#: Every function DeepSpeed wraps that has a formula here.
FORMULAS = _table()

#: Wrapped functions whose formulas are not transcribed (convolutions and upsampling: the
#: stacks compare language models): a model that calls one is not covered, not counted 0.
UNTRANSCRIBED = {F.conv1d: "_conv_flops_compute", F.conv2d: "_conv_flops_compute",
                 F.conv3d: "_conv_flops_compute", F.conv_transpose1d: "_conv_trans_flops_compute",
                 F.conv_transpose2d: "_conv_trans_flops_compute",
                 F.conv_transpose3d: "_conv_trans_flops_compute",
                 F.interpolate: "_upsample_flops_compute", F.upsample: "_upsample_flops_compute"}

WATCHED = frozenset(FORMULAS) | frozenset(UNTRANSCRIBED)


def forward_parts(facts: ModelFacts) -> dict[str, int]:
    """DeepSpeed's forward FLOPs by part: each watched call's formula, its product in the
    part of the module it ran in (`parts.matmul_part`), the rest ``elementwise``."""
    parts: dict[str, int] = {}
    try:
        calls = count_calls(facts.model, facts.forward_kwargs, WATCHED)
    except RuntimeError as error:  # a kernel's meta function refuses what the device runs
        raise NotCovered(f"DeepSpeed's profiler counts a forward run, and "
                         f"{type(facts.model).__name__}'s forward does not run on fake "
                         f"tensors here: {str(error).splitlines()[0]}") from error
    for call in calls:
        if call.function in UNTRANSCRIBED:
            raise NotCovered(f"{type(facts.model).__name__} calls {call.function.__name__} "
                             f"in {call.module or 'the root module'}, whose DeepSpeed formula "
                             f"({UNTRANSCRIBED[call.function]}) exportflops does not transcribe")
        formula = FORMULAS[call.function]
        flops, macs = formula.compute(*call.args, **call.kwargs)
        product = {"matmul": 2 * macs, "contraction": flops, "elementwise": 0}[formula.kind]
        if product:
            part = matmul_part(call.module, formula.name, facts.params.output_path)
            parts[part] = parts.get(part, 0) + product
        if flops - product:
            parts["elementwise"] = parts.get("elementwise", 0) + flops - product
    return parts


@stack("deepspeed", tokens="padded", repository=DEEPSPEED, forward_multiple=True,
       source=f"{PROFILER} _patch_functionals, _patch_tensor_methods, "
              f"FlopsProfiler.print_model_profile")
def deepspeed(facts: ModelFacts) -> dict[str, int]:
    """DeepSpeed's flops profiler (module docstring): its formulas over the calls of one
    forward, by part, and the backward as ``2 x`` that forward (``bwd_factor`` with
    ``recompute_fwd_factor`` 0.0)."""
    if facts.model is None:
        raise NotCovered("DeepSpeed's flops profiler counts a forward run of the model, not "
                         "a formula of the config: pass the model, conventions(..., "
                         "config=model)")
    parts = forward_parts(facts)
    return {**parts, "backward": BACKWARD_FACTOR * sum(parts.values())}
