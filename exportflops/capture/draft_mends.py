"""Mends of torch's propagation of real values in ``torch.export.draft_export``, which decides
each branch on a value as the example's values do (`capture`). Four bugs of torch 2.13 make that
propagation fail or decide on garbage; each mend applies for the one export and is undone
after it, and leaves alone a torch without the function it mends. They replace torch's
private functions because no public hook reaches them; a thread exporting beside the one
mended sees the mends too (exportflops exports from one thread)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from ..torch_internals import FakeTensorMode, free_unbacked_symbols, pytree, require


@contextlib.contextmanager
def values_propagated() -> Iterator[None]:
    """Every mend, for one draft export."""
    with _parameters_copied(), _signbit_meta_bool(), _offsets_compared_unguarded(), \
            _empty_outputs_unchecked():
        yield


@contextlib.contextmanager
def _parameters_copied() -> Iterator[None]:
    """draft_export's fake tensors carry a copy of each real tensor's values, which torch 2.13
    makes only for a tensor whose type is exactly Tensor (``meta_utils._safe_copy``): every dense
    ``nn.Parameter`` is left as uninitialized memory, and each branch on a value computed from
    the weights (a logits check, a router) is decided on garbage. Here a parameter's values
    are copied from its plain-tensor ``.data``."""
    meta_utils = require("meta_utils")
    copy = getattr(meta_utils, "_safe_copy", None)
    with _replaced(meta_utils, "_safe_copy", copy and (lambda dst, src: copy(
            dst, src.data if isinstance(src, torch.nn.Parameter) else src))):
        yield


@contextlib.contextmanager
def _signbit_meta_bool() -> Iterator[None]:
    """torch 2.13's meta of ``prims.signbit`` gives its input's dtype where the op gives bool.
    draft_export checks each fake output against the real one: in an integer floor division
    (``widths // merge`` in transformers' vision interpolation indices, which the Qwen3-VL
    family's towers run) it finds them apart, makes a new size for the output, and fails on it
    (``PendingUnbackedSymbolNotFound``). Here the meta gives bool, as the op does. No int64
    result from before the mend is reused: a fake mode that propagates real values keeps no
    dispatch cache (``FakeTensorMode.cache_enabled``)."""
    _prims = require("prims")

    signbit = torch.ops.prims.signbit.default
    meta = getattr(signbit, "prim_meta_impl", None)
    elementwise = getattr(_prims, "_prim_elementwise_meta", None)
    with _replaced(signbit, "prim_meta_impl", meta and elementwise and functools.partial(
            elementwise, type_promotion=_prims.ELEMENTWISE_PRIM_TYPE_PROMOTION_KIND.ALWAYS_BOOL)):
        yield


@contextlib.contextmanager
def _offsets_compared_unguarded() -> Iterator[None]:
    """draft_export checks each fake output's storage offset against the real one's with a
    Python ``!=`` (``fake_utils._check_fake_real_tensors``), before the output's new sizes are
    bound. ``torch.where(mask)`` gives the columns of a ``nonzero`` result, one of which starts
    at the count of true values, u0: the check guards ``Ne(u0, 3)``, which makes u0 the
    constant 3 and leaves torch no symbol to bind (``PendingUnbackedSymbolNotFound``). Sizes
    are compared without a guard by torch itself; here an offset holding a symbol not yet
    bound is not compared either. The rest of the check runs as it is, and so does the whole
    check of an offset whose symbols are bound (its guard fixes them at the example's values,
    as torch has it)."""
    fake_utils = require("fake_utils")
    check = getattr(fake_utils, "_check_fake_real_tensors", None)
    compare = require("compare_tensor_meta")

    def checked(real_out, fake_out, context="", sizes=True, strides=False,
                storage_offset=True, requires_grad=True):
        env = fake_out.fake_mode.shape_env
        unbound = set(env.pending_fresh_unbacked_symbols) if env is not None else set()
        if not unbound & free_unbacked_symbols(fake_out.storage_offset()) or (
                requires_grad and real_out.requires_grad != fake_out.requires_grad):
            return check(real_out, fake_out, context, sizes, strides, storage_offset,
                         requires_grad)
        return compare(real_out, fake_out, check_sizes=sizes, check_strides=strides,
                       allow_rhs_unbacked=True)

    with _replaced(fake_utils, "_check_fake_real_tensors", check and compare and checked):
        yield


@contextlib.contextmanager
def _empty_outputs_unchecked() -> Iterator[None]:
    """draft_export unpacks its checks of an op's outputs with ``zip(*checks)``, which fails
    for an op with no output tensor (``ValueError: not enough values to unpack``): iterating a
    tensor of no rows (``for mask in masks``, transformers' SAM3-Video over its tracked objects
    before any) is ``unbind`` giving an empty list. Such an output has nothing to check."""

    check = getattr(FakeTensorMode, "_maybe_infer_fake_kernel_from_pytree_out", None)

    def checked(self, func, fake_in, real_in, fake_out, real_out):
        if not pytree.tree_leaves(fake_out):
            return fake_out
        return check(self, func, fake_in, real_in, fake_out, real_out)

    with _replaced(FakeTensorMode, "_maybe_infer_fake_kernel_from_pytree_out",
                   check and checked):
        yield


@contextlib.contextmanager
def _replaced(owner, name: str, mended) -> Iterator[None]:
    """``owner.name`` is ``mended`` inside, as it was after; left alone where ``mended`` is
    falsy (a torch without the function a mend replaces)."""
    if not mended:
        yield
        return
    kept = getattr(owner, name)
    setattr(owner, name, mended)
    try:
        yield
    finally:
        setattr(owner, name, kept)
