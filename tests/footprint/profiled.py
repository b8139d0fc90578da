"""The measured side of the memory tests: torch's own profiler around a real step on cpu."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline


@dataclass(frozen=True)
class Measured:
    peak_bytes: int
    """The most bytes the profiler's memory timeline holds at once over the step."""
    max_by_category: dict[str, int]
    """Each of the profiler's categories (PARAMETER, GRADIENT, OPTIMIZER_STATE, ...) at its own
    maximum."""


def profiled(step: Callable[[], object], steps_before: int = 1) -> Measured:
    """``step`` run ``steps_before`` times, then once under the profiler's memory timeline
    (torch/profiler/_memory_profiler.py): the peak of its live bytes summed over categories,
    and each category's maximum."""
    for _ in range(steps_before):
        step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        kept = step()  # a forward's output is held to the end of the profiled step
    del kept
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return _measured(sizes)


def profiled_after(prepare: Callable[[], object], step: Callable[[object], object]) -> Measured:
    """``step(prepare())`` once before, then once under the profiler's memory timeline, measured
    over ``step`` alone. What ``prepare`` makes (a cache filled by a prefill) is made inside
    the profile: the profiler never sees a tensor made before it freed (CPUAllocator.cpp warns
    so), so a step that drops its input's tensors must get them from inside."""
    step(prepare())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        prepared = prepare()
        with record_function(_MEASURED):
            kept = step(prepared)
        del prepared, kept
    memory_profile = prof._memory_profile()
    event = next(e for e in memory_profile._op_tree.dfs() if e.name == _MEASURED)
    # The timeline's times are in microseconds (``_coalesce_timeline``); its row at a time
    # holds what is live from then on.
    start, end = event.start_time_ns // 1000, event.end_time_ns // 1000
    times, sizes = MemoryProfileTimeline(memory_profile)._coalesce_timeline("cpu")
    first = max(i for i, t in enumerate(times) if t <= start)
    return _measured([row for t, row in zip(times[first:], sizes[first:]) if t <= end])


_MEASURED = "exportflops.tests.measured"


def _measured(sizes: list[list[int]]) -> Measured:
    """The peak and each category's maximum over the timeline's rows ``sizes``."""
    # Column 0 is unused; category c sits at _CATEGORY_TO_INDEX[c] + 1 (``update`` there).
    names = {index + 1: (c.name if c is not None else "UNKNOWN")
             for c, index in _CATEGORY_TO_INDEX.items()}
    return Measured(max(sum(row) for row in sizes),
                    {name: max(row[i] for row in sizes) for i, name in names.items()})


def training_step(model: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """One step of the loop the memory report defines: forward and ``loss``, backward,
    ``AdamW.step()``, ``zero_grad(set_to_none=True)``."""
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def forward_step(model: torch.nn.Module, *args, **kwargs) -> Callable[[], object]:
    def step() -> object:
        with torch.no_grad():
            return model(*args, **kwargs)
    return step
