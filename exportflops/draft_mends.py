"""Mends of torch's propagation of real values in ``torch.export.draft_export``, which decides
each branch on a value as the example's values do (`capture`). Two bugs of torch 2.13 make that
propagation fail or decide on garbage; each mend applies for the one export and is undone
after it, and leaves alone a torch without the function it mends. They replace torch's
private functions because no public hook reaches them; a thread exporting beside the one
mended sees the mends too (exportflops exports from one thread)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def values_propagated() -> Iterator[None]:
    """Both mends, for one draft export."""
    with _parameters_copied(), _signbit_meta_bool():
        yield


@contextlib.contextmanager
def _parameters_copied() -> Iterator[None]:
    """draft_export's fake tensors carry a copy of each real tensor's values, which torch 2.13
    makes only for a tensor whose type is exactly Tensor (``meta_utils._safe_copy``): every dense
    ``nn.Parameter`` is left as uninitialized memory, and each branch on a value computed from
    the weights (a logits check, a router) is decided on garbage. Here a parameter's values
    are copied from its plain-tensor ``.data``."""
    from torch._subclasses import meta_utils

    copy = getattr(meta_utils, "_safe_copy", None)
    if copy is None:
        yield
        return
    meta_utils._safe_copy = lambda dst, src: copy(
        dst, src.data if isinstance(src, torch.nn.Parameter) else src)
    try:
        yield
    finally:
        meta_utils._safe_copy = copy


@contextlib.contextmanager
def _signbit_meta_bool() -> Iterator[None]:
    """torch 2.13's meta of ``prims.signbit`` gives its input's dtype where the op gives bool.
    draft_export checks each fake output against the real one: in an integer floor division
    (``widths // merge`` in transformers' vision interpolation indices, which the Qwen3-VL
    family's towers run) it finds them apart, makes a new size for the output, and fails on it
    (``PendingUnbackedSymbolNotFound``). Here the meta gives bool, as the op does. No int64
    result from before the mend is reused: a fake mode that propagates real values keeps no
    dispatch cache (``FakeTensorMode.cache_enabled``)."""
    from torch import _prims

    signbit = torch.ops.prims.signbit.default
    meta = getattr(signbit, "prim_meta_impl", None)
    elementwise = getattr(_prims, "_prim_elementwise_meta", None)
    if meta is None or elementwise is None:
        yield
        return
    signbit.prim_meta_impl = functools.partial(
        elementwise, type_promotion=_prims.ELEMENTWISE_PRIM_TYPE_PROMOTION_KIND.ALWAYS_BOOL)
    try:
        yield
    finally:
        signbit.prim_meta_impl = meta
