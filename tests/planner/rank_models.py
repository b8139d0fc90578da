"""The model of the per-rank fit tests: token ids embedded (so that the first block's input
needs a gradient and a reentrant checkpoint keeps its parameters' gradients), then two
`NormMLP` blocks whose MLPs its tensor-parallel plan splits; a step of 4 x 32 tokens, whose
activations (4 x 32 x 64 floats after each up-projection) outweigh its 2 x 16 x 64 weights a
block, so that checkpointing moves the peak."""

from __future__ import annotations

import torch
from torch import nn

from tests.parallel_models import NormMLP

VOCAB, HIDDEN, FFN = 32, 16, 64
BATCH, SEQ = 4, 32


class EmbeddedBlocks(nn.Module):
    def __init__(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList([NormMLP(HIDDEN, FFN) for _ in range(2)])
        self.tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return x


def embedded_blocks() -> tuple[EmbeddedBlocks, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return EmbeddedBlocks(), (torch.randint(0, VOCAB, (BATCH, SEQ)),)
