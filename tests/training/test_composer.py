"""Composer's ``model.flops_per_batch(batch)`` from a `FlopsPerBatch`, without Composer: the
adapter hands each kind of batch to the count as the forward takes it."""

from __future__ import annotations

import pytest
import torch

from exportflops.training import flops_per_batch
from exportflops.training.composer import composer_flops_per_batch

IN, OUT = 8, 4


def train_flops(rows: int) -> int:
    """A bias-free Linear's step on plain data: the forward matmul and the weight gradient's,
    rows x IN x OUT multiply-accumulates each at 2 FLOPs; no input gradient."""
    return 2 * (2 * rows * IN * OUT)


@pytest.fixture(scope="module")
def fpb():
    return flops_per_batch(torch.nn.Linear(IN, OUT, bias=False), (torch.randn(3, IN),))


def test_a_dict_batch_is_the_forwards_keyword_arguments(fpb):
    count = composer_flops_per_batch(fpb)
    assert count({"input": torch.randn(5, IN)}) == train_flops(5) == 640


def test_a_tensor_batch_is_the_forwards_one_argument(fpb):
    assert composer_flops_per_batch(fpb)(torch.randn(7, IN)) == train_flops(7)


def test_an_inputs_and_targets_batch_is_read_through_forward_inputs(fpb):
    count = composer_flops_per_batch(fpb, forward_inputs=lambda batch: batch[0])
    assert count((torch.randn(6, IN), torch.randn(6, OUT))) == train_flops(6)
    both = composer_flops_per_batch(fpb, forward_inputs=lambda batch: (batch[0],))
    assert both((torch.randn(2, IN), torch.randn(2, OUT))) == train_flops(2)


def test_a_tuple_batch_without_forward_inputs_is_refused_not_guessed(fpb):
    with pytest.raises(TypeError, match=r"forward_inputs="):
        composer_flops_per_batch(fpb)((torch.randn(2, IN), torch.randn(2, OUT)))
