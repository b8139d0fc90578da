"""One rank of the real two-process step in tests/planner/test_fit_ranks.py (torchrun, gloo on
cpu): `EmbeddedBlocks` split by the layout named on the command line with the `FitPlan` read
from ``<out>/plan.json`` applied between tensor parallelism and FSDP2 (`parallelize`'s
``checkpoint``), then 3 training steps measured by torch's profiler memory timeline. Writes
their peaks to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from exportflops.parallel import Layout
from exportflops.parallel.parallelize import parallelize
from exportflops.records.fit import FitPlan
from tests.footprint.profiled import training_step
from tests.footprint.rank_worker import peaks_in_step
from tests.planner.rank_models import embedded_blocks


def main(layout_name: str, out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    plan = FitPlan.model_validate_json((out / "plan.json").read_text())
    model, (ids,) = embedded_blocks()
    parallelize(model, Layout(**{layout_name: dist.get_world_size()}).device_mesh(),
                checkpoint=plan.apply)
    step = training_step(model, lambda: model(ids).sum())
    peaks = peaks_in_step(step, count=3)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"peak_bytes": peaks}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
