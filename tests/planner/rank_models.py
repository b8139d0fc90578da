"""The models of the per-rank fit tests: token ids embedded (so that the first block's input
needs a gradient and a reentrant checkpoint keeps its parameters' gradients), then two
`NormMLP` blocks whose MLPs its tensor-parallel plan splits; a step of 4 x 32 tokens, whose
activations (4 x 32 x 64 floats after each up-projection) outweigh its 2 x 16 x 64 weights a
block, so that checkpointing moves the peak. `attention_blocks`: the same with causal
self-attention (one head, ``scaled_dot_product_attention``) before each MLP (`AttentionBlock`),
for a context-parallel ring, whose ring attention replaces those calls."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tests.parallel_models import NormMLP

VOCAB, HIDDEN, FFN = 32, 16, 64
BATCH, SEQ = 4, 32


class EmbeddedBlocks(nn.Module):
    def __init__(self, block: Callable[[], nn.Module] = lambda: NormMLP(HIDDEN, FFN)) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList([block() for _ in range(2)])
        self.tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return x


def embedded_blocks() -> tuple[EmbeddedBlocks, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return EmbeddedBlocks(), (torch.randint(0, VOCAB, (BATCH, SEQ)),)


class AttentionBlock(nn.Module):
    """Causal self-attention of one head, then a `NormMLP`, each with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.mlp = NormMLP(HIDDEN, FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)  # each (B, 1, T, H)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)
        return x + self.mlp(x)


def attention_blocks() -> tuple[EmbeddedBlocks, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return EmbeddedBlocks(AttentionBlock), (torch.randint(0, VOCAB, (BATCH, SEQ)),)
