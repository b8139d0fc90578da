"""One rank of the real two-stage pipeline in tests/parallel/test_pipeline_torchrun.py (started
with torchrun, gloo on CPU): splits a small Llama with torch's ``pipeline()``, runs one real
GPipe step over gloo, and writes to ``<out>/rank<r>.json`` what torch's stage received (its
receive buffers, sized from the stage before), the matmul FLOPs torch's FlopCounterMode
saw in the step, and exportflops' single-process analysis of the same split."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline
from torch.utils.flop_counter import FlopCounterMode

from exportflops.examples.llama import LlamaConfig, llama
from exportflops.parallel.pipeline import analyze_pipeline

CONFIG = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                     ffn_dim=128, max_seq_len=64)
SEQ, MICROBATCH, MICROBATCHES = 16, 2, 4


def model_and_microbatch():
    torch.manual_seed(0)
    model, (tokens,) = llama("cpu", CONFIG, seq_len=SEQ, batch=MICROBATCH)
    return model.train(), tokens


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    model, tokens = model_and_microbatch()
    analysis = analyze_pipeline(model, (tokens,), stages=["layers.2"], schedule="gpipe",
                                microbatches=MICROBATCHES, mode="train", device=None)
    pipe = pipeline(model, mb_args=(tokens,),
                    split_spec={"layers.2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, MICROBATCHES,
                             loss_fn=lambda logits, target: logits.float().mean())
    batch = tokens.repeat(MICROBATCHES, 1)
    with FlopCounterMode(display=False) as counter:
        if rank == 0:
            schedule.step(batch)
        else:
            schedule.step(target=torch.zeros(MICROBATCHES * MICROBATCH))
    received = [[list(info.buffer.shape), str(info.buffer.dtype).removeprefix("torch.")]
                for info in stage.args_recv_info[0] if info.buffer is not None]
    (out / f"rank{rank}.json").write_text(json.dumps({
        "record": analysis.record.model_dump_json(), "received": received,
        "matmul_flops": counter.get_total_flops(),
        "macs_by_op": {op: stats.cost.macs
                       for op, stats in analysis.stage_reports[rank].operators.items()}}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
