"""The models of the per-rank memory tests, by the layout dimension they are split on: a
tensor-parallel `Net` carrying its plan, FSDP2's `TwoBlocks` (tests/parallel_models.py)."""

from __future__ import annotations

import torch

from tests.parallel_models import BATCH, HIDDEN, SEQ, TwoBlocks, planned


def two_blocks() -> tuple[TwoBlocks, tuple[torch.Tensor]]:
    return TwoBlocks(), (torch.randn(BATCH, SEQ, HIDDEN),)


MODELS = {"tp": planned, "fsdp": two_blocks}
