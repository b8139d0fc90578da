"""The memory format torch's tracer records on each node, found once per shape while a model is
exported with dynamic sizes.

For every value it records, torch's tracer writes ``node.meta["tensor_meta"]``, whose memory
format asks, through sympy, whether the tensor is contiguous, channels-last or
channels-last-3d (`torch.fx.passes.shape_prop._extract_tensor_metadata`). With symbolic sizes
that was a tenth of the export of a GPT-2 with a dynamic length (`benchmarks/symbolic_floor.py`),
and a block's values have a handful of shapes between them.

While `memory_formats_once` is on, a value plainly contiguous (row-major strides of sizes whose
comparisons with 1 and 2 their ranges decide) is contiguous without asking, as torch's check
would answer without a guard; the format of each other (sizes, strides) pair of expressions is
asked once per shape environment and taken from that answer afterwards; every other field is
torch's, of the tensor itself. The answer is the same for the same expressions: torch's check
reads only the sizes and strides, and the guards its first asking installs decide each later
asking the same way (a guard is only ever added, and agrees with the example's sizes). Nothing
changes in the program; the check is torch's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .shape_kernels import positive_size, row_major
from ..torch_internals import TorchFeatureError, require

@contextlib.contextmanager
def memory_formats_once() -> Iterator[None]:
    """torch's tracer asking each shape's memory format once, and as it was after the block; a
    torch without the function runs as it is."""
    try:
        tracer = require("proxy_tensor")
        torch_extract = tracer._extract_tensor_metadata
    except (TorchFeatureError, AttributeError):
        yield
        return
    formats: dict[tuple, Any] = {}

    def extract(result: torch.Tensor, include_contiguity: bool = True) -> Any:
        if include_contiguity and _plainly_contiguous(result):
            return torch_extract(result, include_contiguity=False)._replace(
                memory_format=torch.contiguous_format)
        key = _shape_key(result) if include_contiguity else None
        if key is None:
            return torch_extract(result, include_contiguity)
        if key in formats:
            return torch_extract(result, include_contiguity=False)._replace(
                memory_format=formats[key])
        meta = torch_extract(result, include_contiguity)
        formats[key] = meta.memory_format
        return meta

    tracer._extract_tensor_metadata = extract
    try:
        yield
    finally:
        tracer._extract_tensor_metadata = torch_extract


def _plainly_contiguous(tensor: torch.Tensor) -> bool:
    """Whether torch's check answers contiguous with every comparison it makes decided without
    a guard: a dense tensor whose strides equal, as expressions, the products of the sizes
    after them, each size an int of at least 1 or a positive multiple of a size symbol whose
    range starts at 2 or more (`shape_kernels.positive_size`). torch's comparisons of the sizes
    with 1 and 2 are then decided by their ranges, and of the strides as expressions. Most of
    a block's values are such; the others are asked (`memory_formats_once`)."""
    return tensor.layout == torch.strided and all(map(positive_size, tensor.shape)) \
        and row_major(tensor)


def _shape_key(tensor: torch.Tensor) -> tuple | None:
    """What the memory format of a dense tensor is a function of: its shape environment and
    the expressions of its sizes and strides; None for any other tensor (torch's check runs)."""
    if tensor.layout != torch.strided:
        return None
    sizes, strides = _expressions(tensor.shape), _expressions(tensor.stride())
    if sizes is None or strides is None:
        return None
    return _shape_env(tensor.shape, tensor.stride()), sizes, strides


def _expressions(values: Any) -> tuple | None:
    expressions = []
    for value in values:
        if type(value) is int:
            expressions.append(value)
        else:
            expression = getattr(getattr(value, "node", None), "expr", None)
            if expression is None:  # a nested int: no expression to key on
                return None
            expressions.append(expression)
    return tuple(expressions)


def _shape_env(*groups: Any) -> Any:
    for group in groups:
        for value in group:
            if type(value) is not int:
                return value.node.shape_env
    return None
