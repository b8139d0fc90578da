"""What the all-ranks view of pp 4 x fsdp 2 x tp 2 costs against one rank's analysis.

The 16 ranks of a pipeline of 4 stages, each stage on fsdp 2 x tp 2 ranks (the mesh (pp, fsdp,
tp), tp innermost): the ranks of one stage differ only by their fsdp and tp index, so they do
the same work on the same shapes, and `count_pipeline` (given ``fsdp`` and ``tp``) stands one
analysis of each stage (its rank with fsdp and tp index 0) for all four. This script times, in
one run on this machine (cpu, fake tensors, a small Llama: 8 layers, 64 wide, a 2 x 64 batch,
forward and backward):

- the all-ranks view: the model split into 4 stages of its own modules, one rank of each stage
  counted unless the stage is alike an earlier one (the two middle stages: 3 analyses), the
  1f1b timeline of 8 microbatches, the 16 ranks placed on the mesh;
- one single-rank analysis: one rank of one stage, counted alone (`count_stage` once);

and prints their ratio. Target (issue 38, item 4): the all-ranks view costs at most a few
single-rank analyses, not 16.

    python benchmarks/parallel_ranks.py [--repeat 3]
"""

from __future__ import annotations

import argparse

from exportflops.aggregate import build_report
from exportflops.parallel.pipeline.ranks import stage_rank_counter
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.parallel.pipeline.analysis import count_pipeline
from exportflops.parallel.pipeline.mesh import llama_stages
from timing import median_seconds

PP, FSDP, TP = 4, 2, 2
CONFIG = LlamaConfig(vocab_size=512, dim=64, n_layers=8, n_heads=4, n_kv_heads=2, head_dim=16,
                     ffn_dim=128, max_seq_len=64)
BATCH, SEQ = 2, 64


def _build(device):
    return llama(device, CONFIG, seq_len=SEQ, batch=BATCH)


def _counter():
    return stage_rank_counter(_build, CONFIG.n_layers, PP, tp=TP, fsdp=FSDP,
                              mode="train")


def all_ranks():
    model, args = _build("meta")
    return count_pipeline(model, args, stages=llama_stages(model, args[0], PP),
                          schedule="1f1b", microbatches=8, share_alike=True,
                          mode="train", count_stage=_counter(), fsdp=FSDP, tp=TP)


def one_rank():
    """One rank of stage 1 (a middle stage: layers 2-3), counted alone and built into its
    report."""
    return build_report(_counter()(1, 1, None))



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, median kept")
    repeat = parser.parse_args().repeat
    record = all_ranks().record  # also warms torch's imports and caches up, untimed
    one_rank()
    view = median_seconds(all_ranks, repeat)
    single = median_seconds(one_rank, repeat)
    analyzed = sorted({s.counted_as for s in record.stages})
    print(f"pp {PP} x fsdp {FSDP} x tp {TP}: {record.world_size()} ranks, "
          f"{len(analyzed)} analyzed: stages {analyzed} (each stage's ranks: "
          f"{'; '.join(str(s.stands_for) for s in record.stages)}; each stage counted as "
          f"{[s.counted_as for s in record.stages]})")
    print(f"all-ranks view:          {view:8.3f} s (median of {repeat})")
    print(f"one single-rank analysis: {single:7.3f} s")
    print(f"ratio:                   {view / single:8.2f} single-rank analyses "
          f"(one per rank would be {record.world_size()}); step set by pipeline rank "
          f"{record.slowest_rank}, global ranks "
          f"{record.stages[record.ranks[record.slowest_rank].stages[0]].stands_for}")


if __name__ == "__main__":
    main()
