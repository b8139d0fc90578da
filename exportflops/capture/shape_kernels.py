"""Shape-only kernels for three composite ops while a model is exported with dynamic sizes.

torch.export records each op in the graph, then runs it on fake tensors for its output's
shape. An op that is a composite of others runs every one of them: ``linear`` a transpose, an
addmm and two views; ``layer_norm`` its Python decomposition (some ten prims);
``scaled_dot_product_attention`` on meta its math path (a causal mask, two matmuls, a
softmax). With symbolic sizes each of those ops checks its sizes and strides through sympy,
so these three were two thirds of the export of a GPT-2 block with a dynamic length, most of
a symbolic analysis (`benchmarks/symbolic_floor.py`). None of those inner ops reaches the
graph.

While `shape_kernels` is on, each of these ops first looks at its inputs: where its output is
plainly a fresh contiguous tensor of a shape read off them (every tensor fake and on meta or
cpu, sizes symbolic and none read from values, no gradient asked for, the sizes that must
match equal as expressions, so torch's own checks of them are true and install no guard), it
makes that tensor with one ``new_empty``; anything else runs torch's composite as before. The
graph, its shapes, strides and guards are then torch's own (tests/capture/test_shape_kernels.py
compares both, case by case, and each fallback); only the numbering of the size reads that
export drops afterwards (``sym_size_int_1``) can differ, as it does between torch releases.

Each kernel is a function of the op's arguments that returns the output's shape, or None for
torch's path; `kernel` registers one. They are installed as the op's Python kernel for
``CompositeImplicitAutograd`` (which the Python dispatcher, on during export, prefers to the
C++ composite) and removed again, also when the export fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..torch_internals import FakeTensor, free_unbacked_symbols

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_ATEN = torch.ops.aten

Output = tuple[torch.Tensor, tuple[Any, ...]]
"""The input whose dtype and device the output has, and the output's shape."""
ShapeOf = Callable[..., Output | None]
_KERNELS: dict[Any, ShapeOf] = {}
"""Op overload -> its output from its arguments (None: torch's composite runs)."""


def kernel(op: Any) -> Callable[[ShapeOf], ShapeOf]:
    """Registers the shape function of ``op``; one per op."""
    def register(shape_of: ShapeOf) -> ShapeOf:
        if op in _KERNELS:
            raise ValueError(f"{op} has a shape kernel already: {_KERNELS[op].__name__}")
        _KERNELS[op] = shape_of
        return shape_of
    return register


@contextlib.contextmanager
def shape_kernels() -> Iterator[None]:
    """The kernels installed for the block, and torch's ops as they were after it. An op that
    has a Python composite kernel already (torch's own, or this block's when nested) keeps it;
    a torch without Python kernels on its ops runs its composites throughout."""
    installed = []
    try:
        for op, shape_of in _KERNELS.items():
            if not _installable(op):
                continue
            op.py_kernels[_COMPOSITE] = _fast(op, shape_of)
            op._dispatch_cache.clear()
            installed.append(op)
        yield
    finally:
        for op in installed:
            del op.py_kernels[_COMPOSITE]
            op._dispatch_cache.clear()


def _installable(op: Any) -> bool:
    return all(hasattr(op, name) for name in ("py_kernels", "_dispatch_cache", "_op_dk")) \
        and _COMPOSITE not in op.py_kernels


def _fast(op: Any, shape_of: ShapeOf) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        output = shape_of(*args, **kwargs)
        if output is None:
            return op._op_dk(_COMPOSITE, *args, **kwargs)
        like, shape = output
        return like.new_empty(shape)
    run.__name__ = f"fast_{shape_of.__name__}"
    return run


@kernel(_ATEN.linear.default)
def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> Output | None:
    """``(*, in) x (out, in) -> (*, out)``: the addmm of the flattened input, viewed back."""
    tensors = [input, weight] if bias is None else [input, weight, bias]
    if not _plain(tensors, ("meta", "cpu")) or input.dim() < 2 or weight.dim() != 2 \
            or not _contiguous(input) or not _same(input.shape[-1:], weight.shape[1:]):
        return None
    if bias is not None and (bias.dim() != 1 or not _same(bias.shape, weight.shape[:1])):
        return None
    return input, (*input.shape[:-1], weight.shape[0])


@kernel(_ATEN.layer_norm.default)
def layer_norm(input: torch.Tensor, normalized_shape: Sequence[Any],
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5, cudnn_enable: bool = True) -> Output | None:
    """The input's shape: an elementwise result, contiguous as the input is."""
    affine = [t for t in (weight, bias) if t is not None]
    count = len(normalized_shape)
    if not _plain([input, *affine], ("meta", "cpu")) or not 0 < count <= input.dim() \
            or not _contiguous(input) \
            or not _same(input.shape[input.dim() - count:], normalized_shape) \
            or not all(_same(t.shape, normalized_shape) for t in affine):
        return None
    return input, tuple(input.shape)


@kernel(_ATEN.scaled_dot_product_attention.default)
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Output | None:
    """``(*, L, E), (*, S, E), (*, S, Ev) -> (*, L, Ev)``, the second matmul of the math path
    (the one meta runs): contiguous whatever the inputs' strides. A mask must broadcast to the
    scores ``(*, L, S)`` with each size equal or 1, and is not given with ``is_causal`` (torch
    refuses both); no dropout, no grouped heads."""
    tensors = [query, key, value]
    if not _plain(tensors, ("meta",)) or dropout_p != 0.0 or enable_gqa \
            or not query.dim() == key.dim() == value.dim() >= 2 \
            or not _same(query.shape[:-2], key.shape[:-2]) \
            or not _same(key.shape[:-1], value.shape[:-1]) \
            or not _same(query.shape[-1:], key.shape[-1:]):
        return None
    if attn_mask is not None:
        scores = (*query.shape[:-1], key.shape[-2])
        if is_causal or not _plain([*tensors, attn_mask], ("meta",), dtypes=False) \
                or attn_mask.dtype not in (torch.bool, query.dtype) \
                or attn_mask.dim() > len(scores) or not all(
                    _expr(size) == 1 or _same((size,), (want,))
                    for size, want in zip(attn_mask.shape[::-1], scores[::-1])):
            return None
    return query, (*query.shape[:-1], value.shape[-1])


def _plain(tensors: list[torch.Tensor], devices: tuple[str, ...], dtypes: bool = True) -> bool:
    """Fake tensors of one dtype (unless ``dtypes`` is False) on one of ``devices``, some size
    symbolic (with static sizes torch's path is cheap, and cached), none read from values,
    none needing a gradient (the output of a kernel has no autograd history)."""
    if not all(isinstance(t, FakeTensor) and t.device.type in devices for t in tensors):
        return False
    if dtypes and len({t.dtype for t in tensors}) != 1:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return any(isinstance(d, torch.SymInt) for t in tensors for d in t.shape) and \
        not any(free_unbacked_symbols(t) for t in tensors)


def _expr(size: Any) -> Any:
    """A size as its sympy expression (comparing these installs no guard), an int as itself."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _same(sizes: Sequence[Any], others: Sequence[Any]) -> bool:
    return len(sizes) == len(others) and all(_expr(a) == _expr(b) for a, b in zip(sizes, others))


def _contiguous(tensor: torch.Tensor) -> bool:
    """Row-major strides, each equal as an expression to the product of the sizes after it."""
    expected: Any = 1
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        if _expr(stride) != expected:
            return False
        expected = expected * _expr(size)
    return True
