"""The step's live bytes at every op, by kind: a sweep over the storages' lifetimes.

A storage is live at op ``i`` when it was made at or before ``i`` and its last reference
dropped after ``i`` (an op's outputs are live together with its inputs: the moment the
allocator holds both). What exists before the step is live from the start.
"""

from __future__ import annotations

from collections.abc import Callable

from .step import StepRun

#: The kinds, in the order the report lists them.
KINDS = ("parameters", "buffers", "gradients", "optimizer", "activations", "temporaries",
         "inputs")


def cuda_blocks(nbytes: int) -> int:
    """The bytes the CUDA caching allocator hands out for ``nbytes``: whole 512-byte blocks
    (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp, which torch's MemTracker rounds
    to in torch/distributed/_tools/mem_tracker.py, ``_calculate_mem_consumed``)."""
    return -(-nbytes // 512) * 512


def exact(nbytes: int) -> int:
    return nbytes


def live_by_kind(run: StepRun, size: Callable[[int], int] = exact) -> list[dict[str, int]]:
    """For each op of ``run``, the bytes of each kind live right after it made its outputs."""
    steps = len(run.ops)
    changes = [dict.fromkeys(KINDS, 0) for _ in range(steps + 1)]
    for storage in run.storages:
        nbytes = size(storage.nbytes)
        changes[max(storage.start, 0)][storage.kind] += nbytes
        if storage.end is not None and storage.end < steps:
            changes[storage.end][storage.kind] -= nbytes
    live = dict.fromkeys(KINDS, 0)
    timeline = []
    for change in changes[:steps]:
        live = {kind: live[kind] + change[kind] for kind in KINDS}
        timeline.append(live)
    return timeline
