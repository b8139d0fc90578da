"""The measured side of the memory tests: torch's own profiler around a real step on cpu."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile
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
