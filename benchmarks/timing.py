"""The one timer the benchmark scripts share: the median wall time of a call, in seconds.

Imported by the scripts as ``timing`` (``python benchmarks/NAME.py`` puts this folder first on
the path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(function: Callable[[], object], repeat: int) -> float:
    """The median of ``repeat`` wall-clock timings of ``function()``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
