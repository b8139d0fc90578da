"""The models of the per-rank memory tests, by the layout dimension they are split on: a
tensor-parallel `NormMLP` net carrying its plan, wide (H 64, F 256) on a short input (1 x 2
tokens) so that its weights, not one activation, make most of its peak; FSDP2's `TwoBlocks`
(tests/parallel_models.py); the pipeline's `TwoBlocks`, split before its second block, on
microbatches of 2 x 8 tokens."""

from __future__ import annotations

import torch
from torch import nn

from tests.parallel_models import BATCH, HIDDEN, SEQ, NormMLP, TwoBlocks

WIDE_HIDDEN, WIDE_FFN = 64, 256
WIDE_BATCH, WIDE_SEQ = 1, 2


class WideNet(nn.Module):
    """One wide `NormMLP` block, up column-parallel and down row-parallel by its plan."""

    def __init__(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        super().__init__()
        self.blocks = nn.ModuleList([NormMLP(WIDE_HIDDEN, WIDE_FFN)])
        self.tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x)


def wide_net() -> tuple[WideNet, tuple[torch.Tensor]]:
    return WideNet(), (torch.randn(WIDE_BATCH, WIDE_SEQ, WIDE_HIDDEN),)


def two_blocks() -> tuple[TwoBlocks, tuple[torch.Tensor]]:
    return TwoBlocks(), (torch.randn(BATCH, SEQ, HIDDEN),)


MODELS = {"tp": wide_net, "fsdp": two_blocks}

#: The pipeline's split point (one block a stage) and the microbatches of its step.
SPLIT, MICROBATCHES = "blocks.1", 4


def pipeline_model() -> tuple[TwoBlocks, tuple[torch.Tensor]]:
    """`TwoBlocks` and one microbatch of its input (B x T x H)."""
    return TwoBlocks(), (torch.randn(BATCH, SEQ, HIDDEN),)
