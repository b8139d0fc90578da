"""One rank of the real two-process step in tests/footprint/test_memory_ranks.py (started with
torchrun, gloo on cpu): the model split by the layout named on the command line as
`exportflops.parallel.parallelize` splits it, then steps 2 to 6 of the training loop, each
measured by torch's profiler memory timeline (tests/footprint/profiled.py). Writes their peaks
to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from exportflops.parallel import Layout
from exportflops.parallel.parallelize import parallelize
from tests.footprint.profiled import profiled, training_step
from tests.footprint.rank_models import MODELS


def main(layout_name: str, out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    layout = Layout(**{layout_name: dist.get_world_size()})
    torch.manual_seed(0)
    model, (x,) = MODELS[layout_name]()
    parallelize(model, layout.device_mesh())
    step = training_step(model, lambda: model(x).sum())
    peaks = peaks_in_step(step, count=5)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"peak_bytes": peaks}))
    dist.destroy_process_group()


def peaks_in_step(step, count: int, attempts: int = 30) -> list[int]:
    """The peaks of ``count`` profiled steps. The profiler's data-flow pass now and then sees
    a tensor's version out of order when gloo's thread bumps it (its "version mismatch"
    assertion, and others of torch/profiler/_memory_profiler.py on a loaded machine): the meter
    failed, not the step, and every rank drops that step together so that all stay in step."""
    peaks: list[int] = []
    for attempt in range(attempts):
        try:
            peak, measured = profiled(step, steps_before=int(attempt == 0)).peak_bytes, 1
        except AssertionError as error:
            if not _in_the_profiler(error):
                raise
            peak, measured = None, 0
        everyone = torch.tensor([measured])
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        if everyone.item():
            peaks.append(peak)
        if len(peaks) == count:
            return peaks
    raise RuntimeError(f"the profiler measured {len(peaks)} of {count} steps in {attempts}")


def _in_the_profiler(error: AssertionError) -> bool:
    """The assertion failed in the profiler's memory pass, not in the step."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.endswith("_memory_profiler.py")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
