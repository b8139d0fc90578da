"""Train mode counts what non-reentrant activation checkpointing reruns in the backward:
torch.utils.checkpoint's early stop and selective policies (torch/utils/checkpoint.py)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, checkpoint_wrapper)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

import exportflops
from exportflops.checkpointing import save_matmuls
from exportflops.count.backward import RECOMPUTED
from exportflops.examples.gpt2 import GPT, GPTConfig

ROWS, WIDTH = 2, 4


class Block(nn.Module):
    """An input linear (so the block's input needs a gradient), then up, relu, down."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))

    def forward(self, x):
        return self.block(self.a(x))


def _checkpointed(model: nn.Module, path: str, selective: bool) -> nn.Module:
    parent, _, child = path.rpartition(".")
    owner = model.get_submodule(parent)
    context = ({"context_fn": functools.partial(create_selective_checkpoint_contexts,
                                                save_matmuls)} if selective else {})
    setattr(owner, child, checkpoint_wrapper(owner.get_submodule(child),
                                             checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                             **context))
    return model


def _recomputed(report) -> list:
    return [n for n in report.nodes if n.note.startswith(RECOMPUTED)]


@pytest.mark.parametrize(("selective", "expected"), [
    # Early stop: the rerun ends when the last tensor the region saved is back. The down
    # linear saves its input and weight before it computes, so it is not rerun: the up
    # linear (2 x 2 x 4 x 4 MACs' FLOPs plus its bias, 2 x 4) and the relu (one per element).
    (False, 2 * ROWS * WIDTH * WIDTH + ROWS * WIDTH + ROWS * WIDTH),
    # The policy keeps addmm's output: only the relu reruns.
    (True, ROWS * WIDTH),
], ids=["whole", "selective"])
def test_a_non_reentrant_region_reruns_up_to_its_last_saved_tensor(selective, expected):
    x = torch.randn(ROWS, WIDTH)
    plain = exportflops.analyze(Block(), (x,), mode="train").total.flops
    model = _checkpointed(Block(), ".block", selective)
    report = exportflops.analyze(model, (x,), mode="train")
    assert sum(n.cost.flops for n in _recomputed(report)) == expected
    assert report.total.flops - plain == expected
    assert all(n.phase == "backward" and n.module.startswith("block.") for n in _recomputed(report))


def _matmul_flops_of_a_step(model: nn.Module, ids: torch.Tensor) -> int:
    """torch's own meter on a real cpu step: FlopCounterMode counts the matrix products that
    run (2 FLOPs per MAC, no bias), recompute included; not the cpu attention kernel
    (pytorch#195460)."""
    with FlopCounterMode(display=False) as counter:
        model(ids).sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("selective", [False, True], ids=["whole", "selective"])
def test_the_recomputed_matmuls_are_the_ones_a_real_step_runs_again(selective):
    config = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    ids = torch.randint(0, 64, (2, 32))
    torch.manual_seed(0)
    plain = _matmul_flops_of_a_step(GPT(config), ids)
    torch.manual_seed(0)
    model = _checkpointed(GPT(config), "transformer.h.0", selective)
    measured = _matmul_flops_of_a_step(model, ids) - plain
    report = exportflops.analyze(model, (ids,), mode="train")
    matmuls = [n for n in _recomputed(report) if n.op in ("aten.addmm.default", "aten.mm.default")]
    assert 2 * sum(n.cost.macs for n in matmuls) == measured
    # By hand, one block of 64 tokens at width 32: c_attn (3C), attn.c_proj (C) and mlp.c_fc
    # (4C) rerun, mlp.c_proj not (early stop); the selective policy keeps them all.
    assert measured == (0 if selective else 2 * 64 * 32 * (3 * 32 + 32 + 4 * 32))


def test_with_dynamic_sizes_a_non_reentrant_recompute_is_a_noted_gap():
    model = _checkpointed(Block(), ".block", False)
    batch = torch.export.Dim("batch")
    report = exportflops.analyze(model, (torch.randn(3, WIDTH),), mode="train",
                                 dynamic_shapes=({0: batch},))
    assert _recomputed(report) == []
    assert any("non-reentrant activation checkpointing in block._checkpoint_wrapped_module is "
               "not counted with dynamic sizes" in note for note in report.capture_notes)


class GroupedTail(nn.Module):
    """A product by a weight, computed as transformers' MoE experts compute it: eager calls
    ``torch._grouped_mm`` (a cpu kernel for float32, whose fake-tensor kernel refuses any
    dtype but bfloat16), a trace another op (`torch.compiler.is_compiling`): the eager search
    for checkpointed modules fails where the export does not."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, WIDTH, WIDTH))

    def forward(self, x):
        if torch.compiler.is_compiling():
            return x @ self.weight[0]
        return torch._grouped_mm(x, self.weight, offs=torch.tensor([ROWS], dtype=torch.int32))


@pytest.mark.parametrize("selective", [False, True], ids=["whole", "selective"])
def test_a_region_is_found_where_the_model_runs_on_fake_tensors_only_when_traced(selective):
    x = torch.randn(ROWS, WIDTH)
    assert GroupedTail()(x).shape == (ROWS, WIDTH)  # eager runs for real
    plain = exportflops.analyze(nn.Sequential(Block(), GroupedTail()), (x,), mode="train")
    model = nn.Sequential(_checkpointed(Block(), ".block", selective), GroupedTail())
    report = exportflops.analyze(model, (x,), mode="train")
    # As in the test above: whole, the up linear (2 x 2 x 4 x 4 MACs' FLOPs, its bias 2 x 4)
    # and the relu (2 x 4) rerun; selective, the relu only (addmm's output is kept).
    expected = (ROWS * WIDTH if selective
                else 2 * ROWS * WIDTH * WIDTH + ROWS * WIDTH + ROWS * WIDTH)
    assert sum(n.cost.flops for n in _recomputed(report)) == expected
    assert report.total.flops - plain.total.flops == expected


def test_the_selective_policy_keeps_transformers_grouped_product_and_reruns_pointwise_ops():
    # Importing transformers' MoE integration registers its custom op.
    from transformers.integrations import moe  # noqa: F401

    grouped = torch.ops.transformers.grouped_mm_fallback.default
    assert save_matmuls(None, grouped) == CheckpointPolicy.MUST_SAVE
    assert save_matmuls(None, torch.ops.aten.silu.default) == CheckpointPolicy.PREFER_RECOMPUTE
