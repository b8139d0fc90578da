"""The memory of a context-parallel rank (`memory_ranks` with ``Layout(cp=C)``): every
parameter, the rank's sequence shard, and the K/V blocks of torch's ring attention
(``_templated_ring_attention``, all-gather rotation), derived from the tiny Llama's shapes."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.errors import InputError, LayoutError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import FP32, LLAMA_PARAMS, LLAMA_TENSORS, gpt, llama

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
CP = 2
ROWS, SEQ, KV_HEADS, HEAD_DIM, LAYERS = 2, 32, 2, 16, 4  # tests.footprint.models.llama
INT64 = 8


@pytest.fixture(scope="module")
def rank_and_shard():
    """Rank 1 of a ring of two, and one device running the same shard (the first 16 positions)
    with no ring."""
    model, args, kwargs = llama()
    rank = memory_ranks(model, args, kwargs, layout=Layout(cp=CP), rank=1)
    ids = kwargs["input_ids"][:, :SEQ // CP]
    shard = exportflops.memory(model, args, {"input_ids": ids, "labels": ids})
    return rank, shard


def test_a_context_parallel_rank_holds_every_parameter_and_its_sequence_shard(rank_and_shard):
    rank, _ = rank_and_shard
    assert (rank.world_size, rank.rank) == (CP, 1)
    held = LLAMA_PARAMS * FP32  # cp alone shards no parameter
    # AdamW: exp_avg and exp_avg_sq of every parameter, and a 0-dim float32 step per tensor
    assert (rank.max_by_kind.parameters, rank.max_by_kind.gradients,
            rank.max_by_kind.optimizer) == (held, held, 2 * held + LLAMA_TENSORS * FP32)
    # input_ids, given again as labels (one tensor, one shard): rows x seq / cp int64 ids
    assert rank.max_by_kind.inputs == ROWS * (SEQ // CP) * INT64


def test_the_ring_adds_its_kv_blocks_over_each_attention_call_and_nowhere_else(rank_and_shard):
    rank, shard = rank_and_shard
    # One K/V block: key and value, rows x kv heads x seq / cp x head dim float32 (the GQA
    # call takes the 2 KV heads unrepeated).
    kv = 2 * ROWS * KV_HEADS * (SEQ // CP) * HEAD_DIM
    forward = (CP + 1) * kv * FP32  # the rank's block concatenated, and its all-gather
    backward = forward + 2 * kv * FP32  # and the K/V gradients' cat and the block received
    added = {point.index: (point.op, point.live.temporaries - base.live.temporaries)
             for point, base in zip(rank.timeline, shard.timeline, strict=True)
             if point.live != base.live}
    attention = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert sorted(added.values()) == sorted(
        [(f"{attention}.default", forward)] * LAYERS
        + [(f"{attention}_backward.default", backward)] * LAYERS)


def test_every_ring_rank_is_reported_and_the_view_names_the_rank_with_the_highest_peak():
    model, args, kwargs = llama()
    view = memory_ranks(model, args, kwargs, layout=Layout(cp=CP), mode="forward")
    assert [report.rank for report in view.ranks] == [0, 1]
    highest = max(view.ranks, key=lambda report: report.peak_bytes)
    assert (view.peak_rank, view.peak_bytes) == (highest.rank, highest.peak_bytes)


@pytest.mark.parametrize("layout, error, words", [
    (Layout(cp=2, dp=2), LayoutError, r"dp=2 cp=2: context parallelism composes with fsdp= "
                                      r"and tp=, not with dp="),
    (Layout(cp=2, pp=2), LayoutError, r"pp=2 cp=2: a pipeline composes with fsdp= and tp=, "
                                      r"not with cp="),
    (Layout(cp=3), InputError, r"a sequence of 32 does not split over cp=3"),
], ids=["cp-with-dp", "cp-with-pp", "sequence-not-split"])
def test_what_a_ring_rank_does_not_model_is_refused_by_name(layout, error, words):
    model, args, kwargs = llama()
    with pytest.raises(error, match=words):
        memory_ranks(model, args, kwargs, layout=layout, rank=0)


def test_a_ring_over_tp_of_a_model_without_a_plan_is_refused_with_where_a_plan_comes_from():
    model, args, kwargs = gpt()
    with pytest.raises(LayoutError, match=r"GPT has no tensor-parallel plan to split it 2 ways"
                                          r".* a tp_plan attribute"):
        memory_ranks(model, args, kwargs, layout=Layout(cp=2, tp=2), rank=0)


def test_a_model_without_token_ids_has_no_sequence_to_split():
    model = torch.nn.Linear(8, 8)
    with pytest.raises(InputError, match=r"Linear: .* no 2-D integer tensor of token ids"):
        memory_ranks(model, (torch.randn(2, 8),), layout=Layout(cp=2), rank=0)
