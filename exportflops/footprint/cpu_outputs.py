"""Ops whose fake kernel makes what their cpu kernel does not, and what the cpu kernel makes
instead: the step runs on fake cpu tensors, and a meta check written for another device must
not stop a step that runs eagerly on cpu, nor a fake output add bytes a real rank never holds.

``aten._grouped_mm``: its meta kernel (``meta_grouped_mm`` in torch/_meta_registrations.py)
applies the CUDA kernel's rules, bfloat16 only; the cpu kernel also multiplies float32 and
float16 (transformers' default ``grouped_mm`` experts, a Mixtral's, call it in float32 on cpu,
routing with ``histc`` and ``cumsum``, no value read). Its other check, a matrix's leading
stride a multiple of 16 bytes, stands; the output has the shape torch's meta kernel gives it,
by its own function (``_create_grouped_mm_output_tensor``), in the inputs' dtype, its rows
padded to 16 bytes as the cpu kernel pads them.

``_c10d_functional.wait_tensor``: the c10d kernel waits on the collective's work and returns
the tensor it was given (``wait_tensor`` in torch/csrc/distributed/c10d/Functional.cpp); its
fake kernel returns a new tensor of the same size, so a collective's output would be held
twice wherever the caller keeps both (DTensor's all-gather on a dim other than 0 keeps the
gathered tensor through its ``cat``: ``all_gather_tensor`` in
torch/distributed/_functional_collectives.py). Measured on four gloo ranks of
``Layout(pp=2, tp=2)`` (tests/footprint/test_memory_pipeline_ranks.py): the last stage's
all-gathered logits were counted twice, 2.2% over its profiled peak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..torch_internals import require, TorchDispatchMode

#: The dtypes torch's cpu _grouped_mm multiplies besides the meta kernel's bfloat16.
_GROUPED_MM_CPU_DTYPES = (torch.float32, torch.float16)


def _grouped_mm(func: Callable[..., torch.Tensor], mat_a: torch.Tensor, mat_b: torch.Tensor,
                offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    on_cpu_only = (mat_a.device.type == "cpu" and bias is None
                   and mat_a.dtype == mat_b.dtype and mat_a.dtype in _GROUPED_MM_CPU_DTYPES)
    if not on_cpu_only:  # the meta kernel's checks and errors stand
        return func(mat_a, mat_b, offs, bias, out_dtype)
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        # The cpu kernel's one check besides the dtype, which the meta kernel also makes.
        if mat.stride()[-1 if mat.stride()[-1] != 1 else -2] * mat.element_size() % 16:
            raise RuntimeError(f"_grouped_mm on cpu refuses {name} of strides {mat.stride()} "
                               f"({mat.dtype}): strides should be multiple of 16 bytes.")
    out = require("grouped_mm_output")(mat_a, mat_b, offs, out_dtype)  # its shape and dtype
    # The cpu kernel pads each output row to a multiple of 16 bytes as the CUDA kernel does
    # (a (6, 5) float32 output has strides (8, 1), 180 bytes); the meta function pads only in
    # a CUDA build of torch.
    alignment = 16 // out.element_size()
    padded = -(-out.shape[-1] // alignment) * alignment
    strides = (out.shape[-2] * padded, padded, 1) if out.dim() == 3 else (padded, 1)
    return torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)


def _wait_tensor(func: Callable[..., torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    """The collective's output itself, as the c10d kernel returns it (module docstring)."""
    return tensor


_AS_ON_CPU: dict[Any, Callable[..., torch.Tensor]] = {
    torch.ops.aten._grouped_mm.default: _grouped_mm}
if torch.distributed.is_available():  # torch registers the functional collectives' ops with it
    _AS_ON_CPU[torch.ops._c10d_functional.wait_tensor.default] = _wait_tensor


class AsOnCpu(TorchDispatchMode):
    """Above the fake mode: each op of `_AS_ON_CPU` as its cpu kernel makes it (module
    docstring); every other op as the fake mode makes it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        made = _AS_ON_CPU.get(func)
        if made is None:
            return func(*args, **(kwargs or {}))
        return made(func, *args, **(kwargs or {}))
