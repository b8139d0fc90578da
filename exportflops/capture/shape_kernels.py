"""Kernels that make an op's output from its inputs' shapes while a model is exported with
dynamic sizes: torch's program, without most of the work torch does to find those shapes.

torch.export records each op in the graph, then runs it on fake tensors for its output's
shape. With symbolic sizes every size and stride check of that run goes through sympy, and an
op that is a composite of others runs them all: ``linear`` a transpose, an addmm and two
views; ``layer_norm`` some ten prims; ``scaled_dot_product_attention`` on meta its math path
(a causal mask, two matmuls, a softmax); ``gelu`` and a broadcast ``add`` their Python
decompositions; ``contiguous`` of a transposed tensor its clone's; a ``view`` the prims
views that split and merge its dims one by one. These were two thirds of
the export of a GPT-2 block with a dynamic length, and that export most of a symbolic analysis
(`benchmarks/symbolic_floor.py`). None of the inner ops reaches the graph.

While `shape_kernels` is on, each op here first looks at its inputs. Where its output is
plainly a fresh contiguous tensor of a shape read off them (or, for ``transpose`` and
``view``, a view of the input with sizes and strides read off it), it makes that tensor,
once: every tensor fake, on meta or cpu (``scaled_dot_product_attention``: meta, where the
math path runs), one dtype, no size 0 and none read from values, no gradient asked for, and
the sizes that must match equal as expressions, so that torch's checks of them are true and
install no guard.
Anything else runs torch's own kernel. The program's nodes, each value's shape, strides,
dtype, device and storage, and its guards and ranges are then torch's own
(tests/capture/test_shape_kernels.py compares both on each case and each fallback); only the
numbers export gives the size reads it drops afterwards (``sym_size_int_1``) can differ.

The fast path's cheap pass (`cheap_ops.Functions`) makes a torch function's first output on
plain meta tensors with the same kernels (`on_meta`): there torch's meta kernels are the same
Python decompositions, a GPT-2 block's first SDPA some 4 ms of a 30 ms pass.

Each kernel is a function of the op's arguments that returns the output, or None for
torch's kernel; `kernel` registers one, at the dispatch keys where it runs: a composite's
``CompositeImplicitAutograd`` (the Python dispatcher, on during export, takes a Python kernel
there before torch's decomposition), any other op's autograd key of meta and cpu tensors
(before fake tensors see the op). They are removed again after the export, also when it fails.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..torch_internals import FakeTensor, free_unbacked_symbols, require

_KEYS = torch._C.DispatchKey
_COMPOSITE = (_KEYS.CompositeImplicitAutograd,)
"""Where a composite op's decomposition runs (the Python dispatcher's table takes a kernel)."""
_AUTOGRAD = (_KEYS.AutogradMeta, _KEYS.AutogradCPU)
"""Where any other op on a meta or cpu tensor first runs: above autograd, before fake tensors."""
_ATEN = torch.ops.aten

Kernel = Callable[..., torch.Tensor | None]
"""The op's output made from its arguments, or None: torch's kernel runs."""
_KERNELS: dict[Any, tuple[Kernel, tuple[Any, ...]]] = {}
"""Op overload -> its kernel and the dispatch keys it is installed at."""


def kernel(op: Any, keys: tuple[Any, ...] = _COMPOSITE) -> Callable[[Kernel], Kernel]:
    """Registers the kernel of ``op`` at ``keys``; one per op."""
    def register(made: Kernel) -> Kernel:
        if op in _KERNELS:
            raise ValueError(f"{op} has a shape kernel already: {_KERNELS[op][0].__name__}")
        _KERNELS[op] = made, keys
        return made
    return register


@contextlib.contextmanager
def shape_kernels() -> Iterator[None]:
    """The kernels installed for the block, and torch's ops as they were after it. An op that
    has a Python kernel at that key already (torch's own, or this block's when nested) keeps
    it; a torch without Python kernels on its ops runs its own throughout."""
    installed = []
    try:
        for op, (made, keys) in _KERNELS.items():
            for key in keys:
                if _installable(op, key):
                    op.py_kernels[key] = _fast(op, key, made)
                    op._dispatch_cache.clear()
                    installed.append((op, key))
        yield
    finally:
        for op, key in installed:
            del op.py_kernels[key]
            op._dispatch_cache.clear()


_ON_META = contextvars.ContextVar("exportflops_shape_kernels_on_meta", default=False)
"""Whether a kernel runs on plain meta tensors (`on_meta`), not on an export's fake ones."""


def on_meta(op: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``op``'s output on plain meta tensors made by its kernel, the same tensor torch's meta
    kernel makes (shape, strides, dtype), without running the ops torch's is made of; None
    where ``op`` has none or it leaves the case to torch, or any tensor is not on meta. For the
    fast path's cheap pass (`cheap_ops.Functions`), which runs each distinct call once."""
    entry = _KERNELS.get(op)
    if entry is None:
        return None
    token = _ON_META.set(True)
    try:
        return entry[0](*args, **kwargs)
    finally:
        _ON_META.reset(token)


def _installable(op: Any, key: Any) -> bool:
    return all(hasattr(op, name) for name in ("py_kernels", "_dispatch_cache", "_op_dk")) \
        and key not in op.py_kernels


def _fast(op: Any, key: Any, made: Kernel) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        output = made(*args, **kwargs)
        return op._op_dk(key, *args, **kwargs) if output is None else output
    run.__name__ = f"fast_{made.__name__}"
    return run


@kernel(_ATEN.linear.default)
def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor | None:
    """``(*, in) x (out, in) -> (*, out)``: the addmm of the flattened input, viewed back."""
    tensors = [input, weight] if bias is None else [input, weight, bias]
    if not _plain(tensors, ("meta", "cpu")) or input.dim() < 2 or weight.dim() != 2 \
            or not row_major(input) or not _same(input.shape[-1:], weight.shape[1:]):
        return None
    if bias is not None and (bias.dim() != 1 or not _same(bias.shape, weight.shape[:1])):
        return None
    return _fresh(input, (*input.shape[:-1], weight.shape[0]))


@kernel(_ATEN.layer_norm.default)
def layer_norm(input: torch.Tensor, normalized_shape: Sequence[Any],
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5, cudnn_enable: bool = True) -> torch.Tensor | None:
    """The input's shape: an elementwise result, contiguous as the input is."""
    affine = [t for t in (weight, bias) if t is not None]
    count = len(normalized_shape)
    if not _plain([input, *affine], ("meta", "cpu")) or not 0 < count <= input.dim() \
            or not row_major(input) \
            or not _same(input.shape[input.dim() - count:], normalized_shape) \
            or not all(_same(t.shape, normalized_shape) for t in affine):
        return None
    return _fresh(input, input.shape)


@kernel(_ATEN.scaled_dot_product_attention.default)
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor | None:
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
    return _fresh(query, (*query.shape[:-1], value.shape[-1]))


@kernel(_ATEN.gelu.default, _AUTOGRAD)
def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor | None:
    """Elementwise: the input's shape, contiguous as the input is (its Python decomposition,
    some eight elementwise prims, otherwise)."""
    if not _plain([input], ("meta", "cpu")) or not row_major(input):
        return None
    return _fresh(input, input.shape)


def _elementwise(input: Any, other: Any) -> torch.Tensor | None:
    """Two contiguous tensors of one floating dtype, one of them of the broadcast shape:
    contiguous, of that shape, as torch's fast binary kernel makes it. Sizes broadcast where
    equal as expressions or one is 1 (torch's checks of them then install no guard)."""
    tensors = [input, other]
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors) \
            or not _plain(tensors, ("meta", "cpu")) or not input.dtype.is_floating_point \
            or not all(row_major(t) for t in tensors):
        return None
    shape = []
    for sizes in itertools.zip_longest(input.shape[::-1], other.shape[::-1], fillvalue=1):
        exprs = [_expr(size) for size in sizes]
        if exprs[0] != exprs[1] and 1 not in exprs:
            return None
        shape.append(sizes[1] if exprs[0] == 1 else sizes[0])
    shape.reverse()
    if not any(_same(t.shape, shape) for t in tensors):
        return None  # both broadcast: torch's slower kernel decides the strides
    return _fresh(input, shape)


@kernel(_ATEN.add.Tensor, _AUTOGRAD)
def add(input: Any, other: Any, alpha: Any = 1) -> torch.Tensor | None:
    return _elementwise(input, other)


@kernel(_ATEN.sub.Tensor, _AUTOGRAD)
def sub(input: Any, other: Any, alpha: Any = 1) -> torch.Tensor | None:
    return _elementwise(input, other)


@kernel(_ATEN.mul.Tensor, _AUTOGRAD)
def mul(input: Any, other: Any) -> torch.Tensor | None:
    return _elementwise(input, other)


@kernel(_ATEN.div.Tensor, _AUTOGRAD)
def div(input: Any, other: Any) -> torch.Tensor | None:
    return _elementwise(input, other)


@kernel(_ATEN.contiguous.default)
def contiguous(input: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format
               ) -> torch.Tensor | None:
    """A copy in row-major order where torch's check says the input is not (its composite's
    ``clone``); the input itself where it is, as torch returns it. The check is torch's own
    (its guards, if any, the same)."""
    if memory_format != torch.contiguous_format or not _plain([input], ("meta", "cpu")) \
            or input.is_contiguous():
        return None
    return _fresh(input, input.shape)


@kernel(_ATEN.transpose.int, _AUTOGRAD)
def transpose(input: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor | None:
    """A view of the input with two sizes and their strides swapped (its Python
    decomposition's result, here one ``as_strided``)."""
    rank = input.dim()
    if not _plain([input], ("meta", "cpu")) or not all(-rank <= d < rank for d in (dim0, dim1)):
        return None
    sizes, strides = list(input.shape), list(input.stride())
    first, second = dim0 % rank, dim1 % rank
    sizes[first], sizes[second] = sizes[second], sizes[first]
    strides[first], strides[second] = strides[second], strides[first]
    return input.as_strided(sizes, strides, input.storage_offset())


@kernel(_ATEN.view.default, _AUTOGRAD)
def view(input: torch.Tensor, size: Sequence[Any]) -> torch.Tensor | None:
    """A view of the input with the sizes asked, found as torch's fake view finds it
    (`torch._refs._reshape_view_helper`, greedily from the left): each size asked is the
    input's next size, equal as an expression, or the product of its next int sizes, merged
    (where their strides nest) and split; the strides follow, without the prims views it runs
    one by one. Every size is an int or a size symbol's multiple, so that torch's checks of
    them against 0 and 1 are decided by their ranges; the contiguity of an input not plainly
    contiguous is torch's own check (its guards, if any, the same). A -1, a 1-d side, a
    squeeze or unsqueeze at the end, and a symbolic size to merge or split are torch's."""
    if not _plain([input], ("meta", "cpu")) or input.dim() < 2 or len(size) < 2 \
            or not all(positive_size(length) for length in (*size, *input.shape)) \
            or getattr(require("fx_experimental_config"), "backed_size_oblivious", False):
        return None  # size-oblivious views: another algorithm (a torch without the flag has none)
    if not row_major(input) and require("is_contiguous_or_false")(input):
        return None  # contiguous after all: torch's, as its shortcuts for it are
    sizes, strides, at = list(input.shape), list(input.stride()), 0
    for length in size:
        if at == len(sizes):
            return None
        if _expr(length) != _expr(sizes[at]) and not _merged_and_split(sizes, strides, at, length):
            return None
        at += 1
    if at != len(sizes):
        return None
    return input.as_strided(sizes, strides, input.storage_offset())


def _merged_and_split(sizes: list, strides: list, at: int, length: Any) -> bool:
    """``sizes[at:]`` (and their strides) with the first dims merged until their product is a
    multiple of ``length``, then that split into ``length`` and the rest, as
    `prims.collapse_view` and `prims.split_dim` make them; False where a size or stride is
    symbolic or the merged dims' strides do not nest (no view: torch raises)."""
    if type(length) is not int or type(sizes[at]) is not int:
        return False
    end, merged = at, sizes[at]
    while merged % length:
        end += 1
        if end == len(sizes) or type(sizes[end]) is not int:
            return False
        merged *= sizes[end]
    if not all(type(stride) is int for stride in strides[at:end + 1]) or not all(
            1 in (sizes[i], sizes[i + 1]) or strides[i] == strides[i + 1] * sizes[i + 1]
            for i in range(at, end)):
        return False
    stride = min([strides[end], *(strides[i] for i in range(at, end) if sizes[i] != 1)])
    sizes[at:end + 1], strides[at:end + 1] = [merged], [stride]
    if merged != length:
        inner = merged // length
        sizes[at:at + 1], strides[at:at + 1] = [length, inner], [stride * inner, stride]
    return True


@kernel(_ATEN.embedding.default, _AUTOGRAD)
def embedding(weight: torch.Tensor, indices: torch.Tensor, padding_idx: Any = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor | None:
    """``(rows, dim)`` at ``(*)`` integer indices -> ``(*, dim)``, contiguous (torch's
    ``index_select`` of the flattened indices, viewed back)."""
    if not _plain([weight, indices], ("meta", "cpu"), dtypes=False) or weight.dim() != 2 \
            or weight.device != indices.device or not weight.dtype.is_floating_point \
            or indices.dtype not in (torch.int64, torch.int32):
        return None
    return _fresh(weight, (*indices.shape, weight.shape[1]))


def positive_size(size: Any) -> bool:
    """An int of at least 1, or a size symbol's positive multiple whose range starts at 2 or
    more (export's: 0 and 1 are specialized), so that torch's checks of it against 0 and 1
    are decided by its range and install no guard."""
    if type(size) is int:
        return size >= 1
    if not isinstance(size, torch.SymInt):
        return False
    expression = getattr(size.node, "expr", None)
    symbol = expression
    if expression is not None and expression.is_Mul and len(expression.args) == 2 \
            and expression.args[0].is_Integer and expression.args[0] > 0:
        symbol = expression.args[1]
    ranges = getattr(size.node.shape_env, "var_to_range", {})
    return symbol is not None and symbol.is_Symbol and symbol in ranges \
        and ranges[symbol].lower >= 2


def _fresh(like: torch.Tensor, shape: Sequence[Any]) -> torch.Tensor:
    """A contiguous fake tensor of ``shape`` with ``like``'s dtype, device and mode, made as
    torch's fast elementwise kernel makes its outputs (`fake_impls.make_fast_binary_impl`): a
    meta tensor, wrapped (`on_meta`: the meta tensor itself). A ``new_empty`` would dispatch
    again, at three times the cost."""
    with require("DisableTorchDispatch")():
        meta = torch.empty(shape, dtype=like.dtype, device="meta")
    return meta if _ON_META.get() else FakeTensor(like.fake_mode, meta, like.device)


def _plain(tensors: list[torch.Tensor], devices: tuple[str, ...], dtypes: bool = True) -> bool:
    """Fake tensors of one dtype (unless ``dtypes`` is False) on one of ``devices``, with no
    real tensors behind them (``draft_export`` propagates those, a kernel would not), no size
    0 (an empty tensor is torch's), none read from values, none needing a gradient (a kernel's
    output has no autograd history). Static sizes are made too: a static part of a dynamic
    export (a head on the last position) costs torch as much per op. With `on_meta`: plain
    meta tensors of one dtype, any sizes."""
    if _ON_META.get():
        return all(type(t) in _PLAIN_TYPES and t.is_meta for t in tensors) and \
            (not dtypes or len({t.dtype for t in tensors}) == 1) and \
            not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    if not all(isinstance(t, FakeTensor) and t.device.type in devices
               and not t.fake_mode.propagate_real_tensors for t in tensors):
        return False
    if dtypes and len({t.dtype for t in tensors}) != 1:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return not any(type(d) is int and d == 0 for t in tensors for d in t.shape) and \
        not any(_unbacked(t) for t in tensors)


def _unbacked(tensor: torch.Tensor) -> bool:
    """Whether a size, stride or the offset of ``tensor`` reads an unbacked symbol (torch's
    check, once per expression: a block's values have a handful between them)."""
    for value in (*tensor.shape, *tensor.stride(), tensor.storage_offset()):
        if isinstance(value, torch.SymInt):
            expression = getattr(value.node, "expr", None)
            if expression is None:  # a nested int: torch's check of the whole tensor
                return bool(free_unbacked_symbols(tensor))
            if _reads_unbacked(expression):
                return True
    return False


@functools.lru_cache(maxsize=1024)
def _reads_unbacked(expression: Any) -> bool:
    return bool(free_unbacked_symbols(expression))


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
"""Tensor types with torch's own kernels (a subclass may override them)."""


def _expr(size: Any) -> Any:
    """A size as its sympy expression (comparing these installs no guard), an int as itself."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _same(sizes: Sequence[Any], others: Sequence[Any]) -> bool:
    return len(sizes) == len(others) and all(_expr(a) == _expr(b) for a, b in zip(sizes, others))


def row_major(tensor: torch.Tensor) -> bool:
    """Row-major strides, each equal as an expression to the product of the sizes after it."""
    expected: Any = 1
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        if _expr(stride) != expected:
            return False
        expected = expected * _expr(size)
    return True
