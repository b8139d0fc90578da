"""Small models and tensor-parallel plans shared by tests/parallel/test_distributed.py and the
worker it starts with torchrun (tests/distributed_worker.py)."""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, FFN = 16, 64
BATCH, SEQ = 2, 8


class NormMLP(nn.Module):
    """A replicated norm, then a 2-layer MLP: up (column-parallel) and down (row-parallel)."""

    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))  # (B, T, hidden)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([NormMLP()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x)


class TwoBlocks(nn.Module):
    """Two `NormMLP` blocks in a ModuleList: what FSDP2 shards one by one, then the root."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([NormMLP(), NormMLP()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class BlocksAndHead(TwoBlocks):
    """`TwoBlocks` and a head of the root's own: parameters FSDP2 shards in the root's unit."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(HIDDEN, FFN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(super().forward(x))


def blocks_and_head() -> tuple[BlocksAndHead, tuple[torch.Tensor]]:
    return BlocksAndHead(), (torch.randn(BATCH, SEQ, HIDDEN),)


def two_blocks() -> tuple[TwoBlocks, tuple[torch.Tensor]]:
    """`TwoBlocks` and its input, for the command's ``--fsdp``."""
    return TwoBlocks(), (torch.randn(BATCH, SEQ, HIDDEN),)


def tensor_parallel(model: Net, mesh, *, sequence: bool = False) -> Net:
    """Megatron's MLP split: up column-wise, down row-wise; with ``sequence``, the norm
    sequence-parallel and the activations between blocks sharded on the sequence (dim 1)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    if sequence:
        plan = {"blocks.0.norm": SequenceParallel(),
                "blocks.0.up": ColwiseParallel(input_layouts=Shard(1)),
                "blocks.0.down": RowwiseParallel(output_layouts=Shard(1))}
    else:
        plan = {"blocks.0.up": ColwiseParallel(), "blocks.0.down": RowwiseParallel()}
    return parallelize_module(model, mesh, plan)


def planned() -> tuple[Net, tuple[torch.Tensor]]:
    """`Net` carrying its tensor-parallel plan as a ``tp_plan`` attribute (what the command's
    ``--tp`` applies to a factory's model), and its input."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = Net()
    model.tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
    return model, (torch.randn(BATCH, SEQ, HIDDEN),)
