"""One rank of the real two-process steps in tests/footprint/test_memory_ranks.py and
test_memory_experts.py (started with torchrun, gloo on cpu): the model split by the layout
named on the command line as the library splits it for its prediction (`SPLITS`), then steps 2
to 6 of the training loop, each measured by torch's profiler memory timeline
(tests/footprint/profiled.py). Writes their peaks to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from exportflops.parallel import Layout
from exportflops.parallel.experts.memory import split_expert_rank
from exportflops.parallel.parallelize import parallelize
from tests.footprint.models import mixtral
from tests.footprint.profiled import profiled, training_step
from tests.footprint.rank_models import MODELS, SKEWED

#: The layouts a test names, of this run's world size.
LAYOUTS: dict[str, Callable[[int], Layout]] = {
    "tp": lambda world: Layout(tp=world),
    "fsdp": lambda world: Layout(fsdp=world),
    "ep": lambda world: Layout(dp=world, ep=world),
}


def _split_dense(name: str) -> Callable[[Layout], tuple[torch.nn.Module, Callable]]:
    """`MODELS[name]` split by `parallelize` on the layout's mesh, its loss the output's sum."""
    def split(layout: Layout) -> tuple[torch.nn.Module, Callable]:
        model, (x,) = MODELS[name]()
        parallelize(model, layout.device_mesh())
        return model, lambda: model(x).sum()
    return split


def _split_experts(layout: Layout) -> tuple[torch.nn.Module, Callable]:
    """The tiny Mixtral split as `memory_ranks` splits this rank's fake copy under routing
    `SKEWED`, its loss the model's."""
    model, args, kwargs = mixtral()
    split_expert_rank(model, args, kwargs, layout=layout, rank=dist.get_rank(), routing=SKEWED)
    return model, lambda: model(*args, **kwargs).loss


#: Each layout's model on this rank, split, with its loss.
SPLITS = {"tp": _split_dense("tp"), "fsdp": _split_dense("fsdp"), "ep": _split_experts}


def main(layout_name: str, out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model, loss = SPLITS[layout_name](LAYOUTS[layout_name](dist.get_world_size()))
    step = training_step(model, loss)
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
