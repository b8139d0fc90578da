"""The models of the per-rank memory tests, by the layout dimension they are split on: a
tensor-parallel `NormMLP` net carrying its plan, wide (H 64, F 256) on a short input (1 x 2
tokens) so that its weights, not one activation, make most of its peak; FSDP2's `TwoBlocks`
(tests/parallel_models.py); the pipeline's `TwoBlocks`, split before its second block, on
microbatches of 2 x 8 tokens; the pipeline over tp's small built-in Llama (`SMALL_LLAMA`);
the expert-parallel Mixtral's routing (`SKEWED`; the model: tests/footprint/models.py)."""

from __future__ import annotations

import torch
from torch import nn

from exportflops.examples.llama import LlamaConfig, llama
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


#: The pipeline over tp's Llama (tests/footprint/test_memory_pipeline_ranks.py): 4 layers of
#: width 64, 4 query and 2 key/value heads of 16, a SwiGLU of 128, a vocabulary of 256.
SMALL_LLAMA = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                          head_dim=16, ffn_dim=128, max_seq_len=64)
#: Its microbatch (batch x sequence tokens) and the microbatches of its step.
LLAMA_BATCH, LLAMA_SEQ, LLAMA_MICROBATCHES = 2, 16, 2


def small_llama(device) -> tuple[nn.Module, tuple[torch.Tensor], dict]:
    """`SMALL_LLAMA` on ``device`` and one microbatch of its token ids."""
    model, args = llama(device, SMALL_LLAMA, seq_len=LLAMA_SEQ, batch=LLAMA_BATCH)
    return model, args, {}


#: Token copies per expert of the tiny Mixtral (4 experts) over both ranks' batches of
#: ``Layout(dp=2, ep=2)`` (2 x 64 tokens x top-2 = 256): rank 0's experts (0, 1) receive 64,
#: rank 1's (2, 3) 192.
SKEWED = [32, 32, 96, 96]
