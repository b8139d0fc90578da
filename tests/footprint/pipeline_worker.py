"""One rank of the real two-stage pipeline step in tests/footprint/test_memory_pipeline.py
(started with torchrun, gloo on cpu): `PIPELINE_MODEL` split before ``blocks.1`` by torch's
``pipeline()``, the stage built by torch, and steps 2 to 6 of the training loop of a schedule
of torch.distributed.pipelining named on the command line, each measured by torch's profiler
memory timeline (tests/footprint/profiled.py), a step the profiler fails to measure dropped
by both ranks (`peaks_in_step`). Writes their peaks to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import pipelining

from tests.footprint.rank_worker import peaks_in_step
from tests.footprint.rank_models import MICROBATCHES, SPLIT, pipeline_model

#: The command line's schedule -> torch's class.
CLASSES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}


def main(schedule_name: str, out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, (microbatch,) = pipeline_model()
    pipe = pipelining.pipeline(model, mb_args=(microbatch,),
                               split_spec={SPLIT: pipelining.SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule = CLASSES[schedule_name](stage, MICROBATCHES,
                                      loss_fn=lambda output, target: output.sum())
    optimizer = torch.optim.AdamW(stage.submod.parameters())
    batch = microbatch.repeat(MICROBATCHES, 1, 1)

    def step() -> None:
        if rank == 0:
            schedule.step(batch)
        else:
            schedule.step(target=torch.zeros(MICROBATCHES))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    (out / f"rank{rank}.json").write_text(json.dumps({"peak_bytes": peaks_in_step(step, 5)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
