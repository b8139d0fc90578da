"""The memory of a context-parallel rank (`memory_ranks` with ``Layout(cp=C)``, and inside FSDP2
and over tensor parallelism, ``Layout(fsdp=F, cp=C, tp=T)``): its parameters (every one with cp
alone; the shards of transformers' Llama plan with tp; FSDP2's over the fsdp x cp ranks, as
`analyze_ranks` shards them, torchtitan's ``dp_shard_cp``), the rank's sequence shard, and the
K/V blocks of torch's ring attention (``_templated_ring_attention``, all-gather rotation) at
its own heads, derived from the tiny Llama's config (tests/footprint/models.py)."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.errors import InputError, LayoutError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import (FP32, LLAMA_PARAMS, LLAMA_TENSORS, gpt, llama,
                                    llama_layer_params, llama_rank_params, llama_root_params)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
CP, TP = 2, 2
ROWS, SEQ, KV_HEADS, HEAD_DIM, LAYERS = 2, 32, 2, 16, 4  # tests.footprint.models.llama
H, V = 64, 256  # the Llama's hidden size and vocabulary
INT64 = 8
STEP = FP32  # AdamW's 0-dim float32 `step` per parameter tensor


@pytest.fixture(scope="module")
def rank_and_shard():
    """Rank 1 of a ring of two, and one device running the same shard (the first 16 positions)
    with no ring."""
    model, args, kwargs = llama()
    rank = memory_ranks(model, args, kwargs, layout=Layout(cp=CP), rank=1)
    ids = kwargs["input_ids"][:, :SEQ // CP]
    shard = exportflops.memory(model, args, {"input_ids": ids, "labels": ids})
    return rank, shard


@pytest.fixture(scope="module")
def ring_over_tp():
    """Rank 3 of Layout(cp=2, tp=2) (place 1 of its ring, tensor-parallel rank 1), and rank 1
    of Layout(tp=2) running the same shard with no ring."""
    model, args, kwargs = llama()
    rank = memory_ranks(model, args, kwargs, layout=Layout(cp=CP, tp=TP), rank=3)
    ids = kwargs["input_ids"][:, :SEQ // CP]
    shard = memory_ranks(model, args, {"input_ids": ids, "labels": ids},
                         layout=Layout(tp=TP), rank=1)
    return rank, shard


def test_a_context_parallel_rank_holds_every_parameter_and_its_sequence_shard(rank_and_shard):
    rank, _ = rank_and_shard
    assert (rank.world_size, rank.rank) == (CP, 1)
    held = LLAMA_PARAMS * FP32  # cp alone shards no parameter
    # AdamW: exp_avg and exp_avg_sq of every parameter, and a 0-dim float32 step per tensor
    assert (rank.max_by_kind.parameters, rank.max_by_kind.gradients,
            rank.max_by_kind.optimizer) == (held, held, 2 * held + LLAMA_TENSORS * STEP)
    # input_ids, given again as labels (one tensor, one shard): rows x seq / cp int64 ids
    assert rank.max_by_kind.inputs == ROWS * (SEQ // CP) * INT64


def test_the_hand_split_of_the_llama_adds_up_to_the_model_at_tp_1():
    assert llama_rank_params(1) == LLAMA_PARAMS


def test_a_ring_rank_over_tp_holds_its_tensor_parallel_shards_and_their_states(ring_over_tp):
    rank, _ = ring_over_tp
    assert (rank.world_size, rank.rank) == (CP * TP, 3)
    held = llama_rank_params(TP) * FP32  # cp shards no parameter: the tp shards, whole
    # The embedding's gradient is the whole table, not its rows: DTensor's rule for
    # embedding_dense_backward (torch/distributed/tensor/_ops/_embedding_ops.py) has no
    # strategy sharding the gradient by rows, and a replicated grad_out gives a Partial of the
    # full weight; it is the last gradient made, with every other shard's held.
    gradients = held + (V * H - V // TP * H) * FP32
    assert (rank.max_by_kind.parameters, rank.max_by_kind.gradients,
            rank.max_by_kind.optimizer) == (held, gradients, 2 * held + LLAMA_TENSORS * STEP)
    assert rank.max_by_kind.inputs == ROWS * (SEQ // CP) * INT64


@pytest.mark.parametrize("ring, tp", [("rank_and_shard", 1), ("ring_over_tp", TP)],
                         ids=["cp", "cp-tp"])
def test_the_ring_adds_its_kv_blocks_over_each_attention_call_and_nowhere_else(request, ring,
                                                                              tp):
    rank, shard = request.getfixturevalue(ring)
    # One K/V block: key and value, rows x kv heads x seq / cp x head dim float32 (the GQA
    # call takes the 2 KV heads unrepeated; a tp rank's k_proj and v_proj give it 2 / tp).
    kv = 2 * ROWS * (KV_HEADS // tp) * (SEQ // CP) * HEAD_DIM
    forward = (CP + 1) * kv * FP32  # the rank's block concatenated, and its all-gather
    backward = forward + 2 * kv * FP32  # and the K/V gradients' cat and the block received
    added = {point.index: (point.op, point.live.temporaries - base.live.temporaries)
             for point, base in zip(rank.timeline, shard.timeline, strict=True)
             if point.live != base.live}
    attention = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert sorted(added.values()) == sorted(
        [(f"{attention}.default", forward)] * LAYERS
        + [(f"{attention}_backward.default", backward)] * LAYERS)


@pytest.mark.parametrize("layout, rank, tp", [
    (Layout(fsdp=2, cp=CP), 3, 1),
    (Layout(fsdp=2, cp=CP, tp=TP), 5, TP),
], ids=["fsdp-cp", "fsdp-cp-tp"])
def test_inside_fsdp2_a_ring_rank_holds_one_fsdp_x_cp_th_of_its_shards(layout, rank, tp):
    model, args, kwargs = llama()
    report = memory_ranks(model, args, kwargs, layout=layout, rank=rank)
    assert (report.world_size, report.rank) == (layout.world_size, rank)
    # 1. FSDP2 shards each of the rank's (tensor-parallel) parameters on dim 0 over the
    #    fsdp x cp = 4 ranks, every dim 0 of them a multiple of 4: no padding.
    sharded = llama_rank_params(tp) * FP32 // (2 * CP)
    # 2. the root's parameters stay unsharded from its forward to its backward's end
    #    (fully_shard's reshard_after_forward: False for the root), and each block's while it
    #    runs, one block at a time.
    unsharded = (llama_root_params(tp) + llama_layer_params(tp)) * FP32
    # 3. the gradients are reduce-scattered into the shards'; AdamW's states are the shards'
    #    twice, with a step per parameter tensor.
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (sharded + unsharded, sharded,
                                              2 * sharded + LLAMA_TENSORS * STEP)
    assert report.max_by_kind.inputs == ROWS * (SEQ // CP) * INT64


@pytest.mark.parametrize("layout", [Layout(cp=CP), Layout(cp=CP, tp=TP)], ids=["cp", "cp-tp"])
def test_every_ring_rank_is_reported_and_the_view_names_the_rank_with_the_highest_peak(layout):
    model, args, kwargs = llama()
    view = memory_ranks(model, args, kwargs, layout=layout, mode="forward")
    assert [(report.rank, report.world_size) for report in view.ranks] == [
        (rank, layout.world_size) for rank in range(layout.world_size)]
    highest = max(view.ranks, key=lambda report: report.peak_bytes)
    assert (view.layout, view.peak_rank, view.peak_bytes) == (
        str(layout), highest.rank, highest.peak_bytes)
    # every place of a ring runs as many positions, every tp rank as many heads
    assert len({report.peak_bytes for report in view.ranks}) == 1


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
