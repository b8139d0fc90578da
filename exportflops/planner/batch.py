"""The largest batch whose step fits a budget: the example inputs resized along their batch
dimension, and a search over the predicted peak."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..torch_internals import pytree

Resize = Callable[[int], tuple[tuple, dict]]
#: Where the search stops doubling: a step of more rows than this is not searched.
MOST_ROWS = 2**20


def batch_of(args: tuple, kwargs: dict) -> int | None:
    """The rows of the example: the first dimension of its first tensor (None: no tensor)."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor) and t.dim() > 0]
    return tensors[0].shape[0] if tensors else None


def by_rows(args: tuple, kwargs: dict, rows: int) -> Resize:
    """The default ``resize``: every input tensor whose first dimension is ``rows`` gets
    ``batch`` rows, the example's rows repeated in turn (row ``i`` is row ``i % rows``: the
    same kind of data, so a mask or labels stay valid); other inputs are passed as they are."""
    def resize(batch: int) -> tuple[tuple, dict]:
        def rows_of(value):
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
                return value[torch.arange(batch, device=value.device) % rows]
            return value
        return pytree.tree_map(rows_of, (args, kwargs))
    return resize


def largest_batch(fits: Callable[[int], bool], low: int = 1, high: int = MOST_ROWS) -> int:
    """The most rows (from ``low`` to ``high``) ``fits`` accepts, assuming a step of more rows
    never needs fewer bytes: doubling until one does not fit, then halving the gap; 0 when
    ``low`` rows do not fit."""
    if not fits(low):
        return 0
    while low < high and fits(min(2 * low, high)):
        low = min(2 * low, high)
    if low == high:
        return low
    high = min(2 * low, high)  # the first size known not to fit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
