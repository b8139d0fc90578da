"""One rank of the real pipeline steps in tests/footprint/test_memory_pipeline.py and
test_memory_pipeline_ranks.py (started with torchrun, gloo on cpu), the pipeline named on the
command line (`STAGES`): ``pp``, `PIPELINE_MODEL` on two ranks split before ``blocks.1`` by
torch's ``pipeline()``, the stage built by torch; ``pp-tp``, the small built-in Llama on four
ranks of ``Layout(pp=2, tp=2)``, split into stages of its own modules and by its
tensor-parallel plan as `memory_ranks` splits it (`split_stages_over_tp`), each stage's
torch ``PipelineStage`` over its pp group. Then steps 2 to 6 of the training loop of the
schedule of torch.distributed.pipelining named on the command line (then as many steps as
the fourth argument says, default 5), each measured by torch's profiler memory timeline
(tests/footprint/profiled.py), a step the profiler fails to measure dropped by every rank
(`peaks_in_step`). Writes their peaks to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import pipelining

from exportflops.parallel import Layout
from exportflops.parallel.pipeline.composed_memory import split_stages_over_tp
from tests.footprint.rank_worker import peaks_in_step
from tests.footprint.rank_models import (LLAMA_MICROBATCHES, MICROBATCHES, SPLIT,
                                         pipeline_model, small_llama)

#: The command line's schedule -> torch's class.
CLASSES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}
CPU = torch.device("cpu")


def _torch_split() -> tuple[pipelining.PipelineStage, torch.Tensor, int]:
    """(this rank's stage, one microbatch, the microbatches of a step): torch's split."""
    torch.manual_seed(0)
    model, (microbatch,) = pipeline_model()
    pipe = pipelining.pipeline(model, mb_args=(microbatch,),
                               split_spec={SPLIT: pipelining.SplitPoint.BEGINNING})
    return pipe.build_stage(dist.get_rank(), CPU), microbatch, MICROBATCHES


def _own_stages_over_tp() -> tuple[pipelining.PipelineStage, torch.Tensor, int]:
    """(this rank's stage, one microbatch, the microbatches of a step): `small_llama` split
    as `memory_ranks` splits it."""
    layout = Layout(pp=2, tp=2)
    mesh = layout.device_mesh()
    pp_rank = layout.coordinates(dist.get_rank())["pp"]
    model, (microbatch,), _ = small_llama("cpu")
    split = split_stages_over_tp(model, microbatch, layout=layout, stages=layout.pp,
                                 mode="train", mesh=mesh)
    stage = pipelining.PipelineStage(split[pp_rank].module, pp_rank, layout.pp, CPU,
                                     group=mesh["pp"].get_group())
    return stage, microbatch, LLAMA_MICROBATCHES


STAGES: dict[str, Callable[[], tuple[pipelining.PipelineStage, torch.Tensor, int]]] = {
    "pp": _torch_split, "pp-tp": _own_stages_over_tp}


def main(schedule_name: str, out: Path, pipeline: str = "pp", steps: str = "5") -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    stage, microbatch, microbatches = STAGES[pipeline]()
    schedule = CLASSES[schedule_name](stage, microbatches,
                                      loss_fn=lambda output, target: output.sum())
    optimizer = torch.optim.AdamW(stage.submod.parameters())
    batch = microbatch.repeat(microbatches, *([1] * (microbatch.dim() - 1)))

    def step() -> None:
        if stage.is_first:
            schedule.step(batch)
        else:
            schedule.step(target=torch.zeros(microbatches))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    peaks = peaks_in_step(step, int(steps))
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"peak_bytes": peaks}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
