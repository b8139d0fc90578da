"""The memory of generation: the peak of a prefill step and of a decode step, and the largest
batch whose steps fit a budget. Imports no torch. Definitions: docs/memory.md, "Generation"."""

from __future__ import annotations

from typing import Literal

from .base import SCHEMA_VERSION, Record
from .memory import MemoryReport
from ..device_table import device_row
from ..errors import InputError, UnknownDeviceError


#: The least batch the lines hold at. At batch 1 torch takes other paths: a reshape of a
#: transposed tensor is a view where from batch 2 it is a copy (eager GPT-2's attention), as
#: torch.export specializes sizes 0 and 1 (docs/memory.md, "Generation").
LINES_FROM_BATCH = 2


class PeakLine(Record):
    """The live bytes at one point of a step as a line in the batch B >= `LINES_FROM_BATCH`:
    ``fixed_bytes + B * bytes_per_sequence`` (every storage of the step is either the same at
    every batch, a weight, or proportional to it, an activation or a sequence's cache)."""

    step: Literal["prefill", "decode"]
    """The step the point is in."""
    index: int
    """The point's position in that step's timeline (`MemoryPoint.index`)."""
    op: str
    """The ATen op at the point."""
    fixed_bytes: int
    """What the point holds whatever the batch: parameters, buffers, batch-free masks."""
    bytes_per_sequence: int
    """What each sequence of the batch adds at the point."""

    def at(self, batch: int) -> int:
        return self.fixed_bytes + batch * self.bytes_per_sequence


class GenerationMemory(Record):
    """The memory of a request of ``new_tokens`` tokens after prompts of ``prompt_len``, on
    ``batch`` sequences: the prefill (one forward under no_grad over the prompt, filling an
    empty cache) and the decode step of the largest context (the last fed token, at
    ``context - 1`` cached entries), each a `MemoryReport`; from the same two steps run at
    three batches from 2 up, each point of both as a line in the batch (`PeakLine`), and
    from them run at batch 1 the peak of one sequence, so that the peak at any batch and the
    largest batch that fits a budget follow."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The model's class."""
    batch: int
    """Sequences per step in ``prefill`` and ``decode``."""
    prompt_len: int
    """Prompt tokens per sequence (P)."""
    new_tokens: int
    """Tokens generated per sequence (G)."""
    context: int
    """Positions the request reaches, P + G - 1 (the last new token is never fed back)."""
    allocator: Literal["exact", "cuda"]
    """As `MemoryReport.allocator`."""
    kv_cache_bytes: int
    """The bytes of the cache the decode step starts with (``context - 1`` entries per layer,
    a sliding-window layer's window at most), over the batch."""
    prefill: MemoryReport
    """The prefill step."""
    decode: MemoryReport
    """The decode step of the largest context."""
    one_sequence_peak_bytes: int
    """The higher of the two steps' peaks with one sequence, from the steps run at batch 1
    (the lines start at batch 2, `LINES_FROM_BATCH`)."""
    peak_lines: list[PeakLine]
    """The points of both steps that are the highest at some batch >= 2, by growing
    ``bytes_per_sequence``: the upper envelope of every point's line."""

    @property
    def peak_bytes(self) -> int:
        """The higher of the two steps' peaks at ``batch``."""
        return max(self.prefill.peak_bytes, self.decode.peak_bytes)

    def peak_bytes_at(self, batch: int) -> int:
        """The higher of the two steps' peaks with ``batch`` sequences."""
        if batch < 1:
            raise InputError(f"peak_bytes_at({batch}) of {self.model}: a step runs at least "
                             f"one sequence.")
        if batch < LINES_FROM_BATCH:
            return self.one_sequence_peak_bytes
        return max(line.at(batch) for line in self.peak_lines)

    def largest_batch(self, device: str | None = None, *, budget_bytes: int | None = None
                      ) -> int:
        """The most sequences whose prefill and decode steps both fit ``budget_bytes``, or
        the memory of ``device`` (a key of the device table): 0 when even one does not fit.
        Only tensor storage is counted (docs/memory.md), so leave room for the CUDA context
        and kernels' workspaces."""
        budget = self._budget(device, budget_bytes)
        if self.one_sequence_peak_bytes > budget:
            return 0
        if self.peak_bytes_at(LINES_FROM_BATCH) > budget:
            return LINES_FROM_BATCH - 1
        growing = [line for line in self.peak_lines if line.bytes_per_sequence > 0]
        if not growing:
            raise InputError(f"No point of {self.model}'s steps grows with the batch: every "
                             f"batch fits {budget} bytes.")
        return min((budget - line.fixed_bytes) // line.bytes_per_sequence for line in growing)

    def _budget(self, device: str | None, budget_bytes: int | None) -> int:
        if (device is None) == (budget_bytes is None):
            raise InputError(f"largest_batch() of {self.model} takes a device key or "
                             f"budget_bytes=, exactly one of them.")
        if budget_bytes is not None:
            return budget_bytes
        row = device_row(device)
        if row.memory_bytes is None:
            raise UnknownDeviceError(
                f"The device table's {device} row covers boards with different memory; pass "
                f"budget_bytes= your board's torch.cuda.get_device_properties(0).total_memory.")
        return row.memory_bytes
