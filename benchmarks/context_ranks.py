"""What the all-ranks view of cp 2 x tp 2 x fsdp 2 costs against one rank's analysis.

The 8 ranks of context parallelism on torchtitan's mesh (fsdp, cp, tp): every rank runs its
tensor-parallel rank on its ring's share of the sequence, so one tensor-parallel rank stands
for all of them (`exportflops.parallel.context.tp`): its count read at four lengths of its
share (FSDP2 traced in the first only), plus the single-device analysis that finds the
sequence and the attention calls. This script times, in one run on this machine (cpu, fake
tensors, a small decoder of 4 blocks, 64 wide, a 2 x 256 batch, forward and backward):

- the all-ranks view: ``exportflops ... --cp 2 --tp 2 --fsdp 2`` as the command computes it;
- one single-rank analysis: one rank of tp 2 x fsdp 4 on the whole sequence (``--tp 2 --fsdp
  4``), the count the view repeats;

and prints their ratio. Target (issue 38, item 4): the all-ranks view costs at most a few
single-rank analyses, not one per rank.

    python benchmarks/context_ranks.py [--repeat 3]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from exportflops.cli.ranks import analyze_split
from exportflops.cli.options import check, parser
from exportflops.parallel import Layout, analyze_ranks
from timing import median_seconds

DIM, HEADS, LAYERS, BATCH, SEQ = 64, 4, 4, 2, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        h = self.norm(x)
        q, k, v = (p(h).view(B, L, -1, DIM // HEADS).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, L, -1))
        return x + self.down(F.gelu(self.up(x)))


class Decoder(nn.Module):
    """A small decoder with the plan torchtitan gives attention and the MLP."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        self.embed = nn.Embedding(512, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.tp_plan = {f"layers.*.{name}": ColwiseParallel() for name in ("q", "k", "v", "up")}
        self.tp_plan |= {f"layers.*.{name}": RowwiseParallel() for name in ("o", "down")}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return x


def decoder(device):
    """The command's factory: the model and a batch of token ids."""
    return Decoder().to(device), (torch.zeros(BATCH, SEQ, dtype=torch.long, device=device),)


def _namespace(*flags: str) -> argparse.Namespace:
    ns = parser().parse_args([f"{__file__}:decoder", "--mode", "train", *flags])
    check(ns)
    return ns


def all_ranks():
    return analyze_split(_namespace("--cp", "2", "--tp", "2", "--fsdp", "2")).record


def one_rank():
    model, args = decoder("meta")
    return analyze_ranks(model, args, layout=Layout(fsdp=4, tp=2), rank=0, mode="train")



def main() -> None:
    parser_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_.add_argument("--repeat", type=int, default=3, help="runs of each, median kept")
    repeat = parser_.parse_args().repeat
    record = all_ranks()  # also warms torch's imports and caches up, untimed
    one_rank()
    view = median_seconds(all_ranks, repeat)
    single = median_seconds(one_rank, repeat)
    print(f"cp {record.cp} x tp {record.tp} x fsdp {record.fsdp}: {record.world_size()} ranks, "
          f"one tensor-parallel rank counted at 4 lengths, plus the single-device analysis")
    print(f"all-ranks view:           {view:8.3f} s (median of {repeat})")
    print(f"one single-rank analysis: {single:8.3f} s")
    print(f"ratio:                    {view / single:8.2f} single-rank analyses (one per rank "
          f"would be {record.world_size()}); busiest rank {record.busiest.rank}")


if __name__ == "__main__":
    main()
