"""One rank of the real two-process run in tests/parallel/test_distributed.py (started with
torchrun, gloo on CPU): analyzes its rank, then runs a real training step with torch's CommDebugMode
counting the collectives that actually ran. Writes both to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

import exportflops
from tests.parallel_models import BATCH, HIDDEN, SEQ, Net, tensor_parallel


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = tensor_parallel(Net(), mesh)
    x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    report = exportflops.analyze(model, (x,), mode="train")
    with CommDebugMode() as comm:
        model(x).sum().backward()  # a real step: gloo moves the tensors
    ran = {str(op): calls for op, calls in comm.get_comm_counts().items()}
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"report": report.model_dump_json(), "ran": ran}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
