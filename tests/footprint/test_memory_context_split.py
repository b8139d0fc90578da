"""The memory of a ring rank composed with tensor parallelism and FSDP2 (`memory_ranks` with
``Layout(fsdp=F, cp=C, tp=T)``): the tensor-parallel shards of transformers' Llama plan, FSDP2
over the fsdp x cp ranks (as `analyze_ranks` shards them, torchtitan's ``dp_shard_cp``), the
rank's sequence shard and the ring's K/V blocks at its own heads, derived from the tiny Llama's
config (tests/footprint/models.py)."""

from __future__ import annotations

import pytest
import torch

from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import (FP32, LLAMA_PARAMS, LLAMA_TENSORS, llama,
                                    llama_layer_params, llama_rank_params, llama_root_params)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
CP, TP = 2, 2
ROWS, SEQ, HEAD_DIM, LAYERS = 2, 32, 16, 4  # tests.footprint.models.llama
H, V, KV_HEADS = 64, 256, 2  # hidden, vocabulary, key/value heads
INT64 = 8
STEP = FP32  # AdamW's 0-dim float32 `step` per parameter tensor


def test_the_hand_split_adds_up_to_the_model_at_tp_1():
    assert llama_rank_params(1) == LLAMA_PARAMS


@pytest.fixture(scope="module")
def ring_over_tp():
    """Rank 3 of Layout(cp=2, tp=2) (place 1 of its ring, tensor-parallel rank 1), and rank 1
    of Layout(tp=2) running the same 16 positions of each row with no ring."""
    model, args, kwargs = llama()
    rank = memory_ranks(model, args, kwargs, layout=Layout(cp=CP, tp=TP), rank=3)
    ids = kwargs["input_ids"][:, :SEQ // CP]
    alone = memory_ranks(model, args, {"input_ids": ids, "labels": ids},
                         layout=Layout(tp=TP), rank=1)
    return rank, alone


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
    # input_ids, given again as labels (one tensor, one shard): rows x seq / cp int64 ids
    assert rank.max_by_kind.inputs == ROWS * (SEQ // CP) * INT64


def test_the_ring_blocks_of_a_tp_rank_are_its_own_kv_heads(ring_over_tp):
    rank, alone = ring_over_tp
    # One K/V block: key and value of the rank's KV_HEADS / tp heads (k_proj and v_proj split
    # by heads), rows x 1 head x seq / cp x head dim float32.
    kv = 2 * ROWS * (KV_HEADS // TP) * (SEQ // CP) * HEAD_DIM
    forward = (CP + 1) * kv * FP32  # the rank's block concatenated, and its all-gather
    backward = forward + 2 * kv * FP32  # and the K/V gradients' cat and the block received
    added = {point.index: (point.op, point.live.temporaries - base.live.temporaries)
             for point, base in zip(rank.timeline, alone.timeline, strict=True)
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
    shards = 2 * CP
    sharded = llama_rank_params(tp) * FP32 // shards
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


def test_every_rank_of_a_ring_over_tp_is_reported_and_each_holds_the_same_bytes():
    model, args, kwargs = llama()
    view = memory_ranks(model, args, kwargs, layout=Layout(cp=CP, tp=TP), mode="forward")
    assert [(report.rank, report.world_size) for report in view.ranks] == [
        (rank, CP * TP) for rank in range(CP * TP)]
    # every place of the ring runs as many positions, every tp rank as many heads
    assert len({report.peak_bytes for report in view.ranks}) == 1
    assert (view.layout, view.peak_rank, view.peak_bytes) == (
        "Layout(cp=2, tp=2)", 0, view.ranks[0].peak_bytes)
