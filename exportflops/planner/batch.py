"""The search for the largest size (a batch, a length) whose step fits a budget, given
whether a size fits, and the type of a user's ``resize``."""

from __future__ import annotations

from collections.abc import Callable

Resize = Callable[[int], tuple[tuple, dict]]
#: Where the search stops doubling: a step of more rows than this is not searched.
MOST_ROWS = 2**20


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
