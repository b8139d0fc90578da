"""What the user can do next when torch.export fails: a hint per kind of torch error."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from ..torch_internals import pytree
from .placement import input_name

#: The words of torch's errors for a branch on a tensor's value that shapes cannot decide.
DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "data dependent")
#: ... for a tensor the model's code made on cpu meeting the model's meta tensors.
MADE_ON_CPU = ("devices, meta and cpu", "devices, cpu and meta")
#: ... for a value read (``.tolist()``) from a meta tensor, which holds none.
READ_ON_META = ("tensor with unallocated storage",)
#: How the command analyzes a model on cpu.
_ON_CPU = "(the command: --device cpu, with --layers N to keep it small)"
_HINTS = [
    # Before the signature hint: torch's device message names the "argument" it checked.
    (MADE_ON_CPU,
     "the model's code makes a tensor on cpu (torch.tensor or torch.arange without device=) "
     f"and meets the model's meta tensors. Analyze the model on cpu {_ON_CPU}, or create that "
     f"tensor on the model's device."),
    (READ_ON_META,
     "the model reads a tensor's values (.tolist()) where its tensors are on meta, which hold "
     f"none. Analyze the model on cpu {_ON_CPU}."),
    ((".numpy()", "__array__"),
     "the model hands a tensor's values to numpy, which torch.export cannot trace. On cpu "
     f"{_ON_CPU} exportflops counts one eager run instead, and lists each call where values "
     "leave torch as uncounted; or compute that part with torch ops."),
    (("Inference tensors", "inference tensor"),
     "the model's parameters (or inputs) were created under torch.inference_mode(), and autograd "
     "cannot train them. For mode='train', build the model and inputs outside inference_mode."),
    (DATA_DEPENDENT,
     "the model branches on a tensor's value. With real tensors (not meta), exportflops decides "
     "each such branch as the example's values do (torch.export.draft_export) and counts that "
     f"path: build the model and inputs on cpu {_ON_CPU}. Or rewrite the branch with "
     "torch.cond (both branches are then counted), or make the condition depend on shapes "
     "only."),
    (("Cache", "pytree", "flatten"),
     "an input or output is an object torch.export cannot flatten. For Hugging Face models "
     "pass use_cache=False (the DynamicCache output), or return plain tensors."),
    # Before the signature hint: torch's dtype message also names the "argument" it checked
    # ("Expected tensor for argument #1 'indices' to have one of the following scalar types").
    (("scalar type",),
     "an example input has a dtype the op that consumes it refuses (an embedding takes integer "
     "token ids, not the float32 tensor input_shape= or torch.randn builds): pass args= with "
     "tensors of the dtype forward() expects (torch.randint(..., dtype=torch.long) for ids)."),
    (("missing", "positional argument", "unexpected keyword", "takes", "argument"),
     "the example args/kwargs do not match forward()'s signature: pass args as a tuple of "
     "forward's positional arguments and kwargs as a dict."),
    # torch's shape checks in mm, broadcasting and convolution
    (("must have same reduction dim", "cannot be multiplied", "must match the size of tensor",
      "expected input", "size mismatch"),
     "an op rejected the example inputs' sizes: give args the shapes (and dtypes) forward() "
     "expects."),
]


def hint(error: Exception, model: torch.nn.Module, inputs: Any = ()) -> str:
    """The user's next step after torch.export raised ``error`` on ``model`` called with
    ``inputs`` (its args and kwargs)."""
    quantized = sorted({type(m).__name__ for m in model.modules()
                        if type(m).__module__.startswith("torch.ao.nn.quantized")})
    if quantized:
        return (f"the model holds eager-mode quantized modules ({', '.join(quantized)}), whose "
                f"packed weights torch.export cannot trace. Analyze the float model before "
                f"quantize_dynamic: an int8 matmul does the same MACs as the float one.")
    strided = _strides_hint(error, model, inputs)
    if strided:
        return strided
    weights = {t.device.type for t in (*model.parameters(), *model.buffers())}
    given = {t.device.type for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)}
    if _says(error, MADE_ON_CPU) and len(weights) == 1 and given - weights:
        (device,) = weights
        return (f"the example inputs are on {', '.join(sorted(given - weights))} and the "
                f"model's weights on {device}: create the inputs on {device} "
                f"(device={device!r} in torch.randn, torch.zeros, ...).")
    for needles, advice in _HINTS:
        if _says(error, needles):
            return advice
    return ("see torch.export's message below; torch.export.draft_export(model, args) lists "
            "every problem at once.")


def _strides_hint(error: Exception, model: torch.nn.Module, inputs: Any) -> str:
    """The hint where ``error`` is about the strides of an input that is not contiguous (a
    slice of a larger tensor, a transpose): torch names it as forward's parameter (``L['x']``,
    in a guard a dynamic size cannot meet: a slice of a dataset with 33 columns is contiguous
    only where its length is 33) or by its strides (a ``view`` they do not allow); else
    empty. Not mended by a contiguous copy: the copies a model's own ``contiguous`` or
    ``reshape`` then makes (or not) would change the bytes counted."""
    message = str(error)
    try:
        bound = inspect.signature(model.forward).bind(*inputs[0], **inputs[1]).arguments
    except (TypeError, ValueError, IndexError):
        bound = {}
    parameters = {id(value): name for name, value in bound.items()}
    for path, leaf in pytree.tree_leaves_with_path(inputs):
        if not isinstance(leaf, torch.Tensor) or leaf.is_contiguous():
            continue
        strides = tuple(leaf.stride())
        parameter = parameters.get(id(leaf))
        if f"strides {strides}" in message or (
                parameter is not None and _size_against_stride(message, parameter, strides)):
            name = input_name(path)
            return (f"{name}{f' ({parameter})' if parameter else ''} is not contiguous: its "
                    f"strides {strides} (shape {list(leaf.shape)}) are those of a slice of a "
                    f"larger tensor or a transpose, and torch.export's checks follow from "
                    f"them. Pass {name}.contiguous(), whose FLOPs are the same (they depend on "
                    f"sizes, not strides).")
    return ""


def _size_against_stride(message: str, parameter: str, strides: tuple[int, ...]) -> bool:
    """Whether torch's ``message`` holds a guard comparing a size of forward's ``parameter``
    with one of its ``strides`` (``L['x'].size()[1] != 33`` for strides ``(33, 1)``)."""
    guards = re.findall(rf"L\['{re.escape(parameter)}'\]\.size\(\)\[\d+\]\s*[!=]=\s*(\d+)",
                        message)
    return any(int(value) in strides for value in guards if int(value) > 1)


def first_lines(error: BaseException, limit: int = 12) -> str:
    """The first ``limit`` lines of ``error``'s message (torch's run to pages)."""
    lines = str(error).strip().splitlines()
    return "\n".join(lines[:limit] + (["..."] if len(lines) > limit else []))


def _says(error: BaseException, needles: tuple[str, ...]) -> bool:
    """Whether ``error``'s type or message holds one of ``needles``."""
    return any(n in f"{type(error).__name__} {error}" for n in needles)


def data_dependent(error: BaseException) -> bool:
    """Whether torch's ``error`` is a branch on a tensor's value that shapes cannot decide."""
    return _says(error, DATA_DEPENDENT)


def meta_only(error: BaseException) -> str | None:
    """Why a model on meta failed as it would not on cpu, where ``error`` (torch's) says so:
    a branch on a tensor's value, a tensor its code made on cpu, or a value it read; else
    None."""
    for needles, why in ((DATA_DEPENDENT, "it branches on its inputs' values"),
                         (MADE_ON_CPU, "its code makes a tensor on cpu"),
                         (READ_ON_META, "it reads a tensor's values")):
        if _says(error, needles):
            return why
    return None


def undecided_hint(step: str, failure: BaseException) -> str:
    """The hint when the example's values could not decide a model's branches either: ``step``
    (draft_export, or the check run of its program) raised ``failure``."""
    return (f"the model branches on a tensor's value, and deciding each branch as the example's "
            f"values do failed too ({step}: {type(failure).__name__}: "
            f"{first_lines(failure, 2)}). Rewrite the branch with torch.cond (both branches "
            f"are then counted), or make the condition depend on shapes only.")
