"""The memory of an expert-parallel rank over tensor-parallel ranks and inside FSDP2
(`memory_ranks` with ``Layout(tp=T, ep=T)``, ``Layout(fsdp=F, ep=E)``,
``Layout(fsdp=F, tp=T, ep=E)``), derived from the tiny Mixtral's shapes
(tests/footprint/models.py: hidden H 64, key/value width 32, 4 experts of MLP 128, vocabulary
256, 2 layers, top-2 routing, a batch of 2 x 32 tokens) and the layouts torchtitan builds:
the routed experts sharded over ep (``ExpertParallel``), then over the efsdp ranks holding the
same experts; everything else by the model's tensor-parallel plan (transformers'
``base_model_tp_plan``: q/k/v column-wise, o row-wise, the embedding and the head by
vocabulary, the router and the norms replicated), then FSDP2 over fsdp."""

from __future__ import annotations

import pytest
import torch

from exportflops.errors import InputError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import FP32, MIXTRAL_TENSORS, mixtral

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
H, KV, FFN, VOCAB, EXPERTS, LAYERS = 64, 32, 128, 256, 4, 2
ATTENTION = H * H + 2 * H * KV + H * H  # q, k + v, o: split by tp
REPLICATED = H * EXPERTS + 2 * H  # the router (mlp.gate) and the two norms: whole on each tp rank
EXPERTS_LAYER = EXPERTS * 2 * FFN * H + EXPERTS * H * FFN  # gate_up_proj, down_proj
VOCABULARY = 2 * VOCAB * H  # the embedding and the untied head: split by tp on the vocabulary
STEP = 4  # AdamW's float32 `step` per parameter tensor


def _adamw(held: int) -> int:
    """exp_avg and exp_avg_sq of each parameter the rank holds, and a step per tensor."""
    return 2 * held + MIXTRAL_TENSORS * STEP


def _dense_share(tp: int) -> int:
    """What a tensor-parallel rank holds of the parameters outside the routed experts."""
    return LAYERS * (ATTENTION // tp + REPLICATED) + VOCABULARY // tp + H  # + the final norm


def _rank(layout: Layout, rank: int = 0, **options):
    model, args, kwargs = mixtral()
    return memory_ranks(model, args, kwargs, layout=layout, rank=rank, **options)


def test_an_expert_rank_over_tp_holds_its_experts_and_its_tensor_parallel_shards():
    tp = ep = 2
    report = _rank(Layout(tp=tp, ep=ep), rank=1)
    assert (report.world_size, report.rank) == (2, 1)
    # 1. the tp plan splits attention and the vocabulary in two and keeps the router and the
    #    norms whole; the routed experts, which the plan leaves alone, are sharded over ep.
    held = (_dense_share(tp) + LAYERS * EXPERTS_LAYER // ep) * FP32
    assert held == (2 * (6144 + 384) + 16384 + 64 + 2 * 49152) * 4 == 511232
    # 2. the embedding's gradient is whole (V x H) on each rank: DTensor's
    #    embedding_dense_backward_strategy (torch/distributed/tensor/_ops/_embedding_ops.py)
    #    has no vocabulary-sharded gradient, so with the ids replicated it is replicated.
    embedding_rest = (VOCAB * H - VOCAB * H // tp) * FP32
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (held, held + embedding_rest, _adamw(held))


def test_an_expert_rank_inside_fsdp2_holds_its_shards_and_the_units_in_flight():
    fsdp = ep = 2
    report = _rank(Layout(fsdp=fsdp, ep=ep))
    # 1. FSDP2 shards everything but the experts over the 2 fsdp ranks; the experts, the rank's
    #    E / ep, over efsdp = fsdp / ep = 1 rank: whole.
    dense, experts = _dense_share(1), LAYERS * EXPERTS_LAYER // ep
    sharded = (dense // fsdp + experts) * FP32
    assert sharded == (58176 // 2 + 98304) * 4 == 509568
    # 2. in flight at once: the root's all-gathered parameters (embedding, head, final norm:
    #    FSDP2 keeps the root unsharded after its forward), one block's, and its experts': over
    #    one rank FSDP2 gathers nothing but still copies the shard into the all-gather output
    #    it allocates (FSDPParamGroup.wait_for_unshard, world_size == 1,
    #    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py).
    in_flight = (VOCABULARY + H + ATTENTION + REPLICATED + EXPERTS_LAYER // ep) * FP32
    # 3. each gradient is reduce-scattered into its shard's; AdamW's states are the shards'.
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (sharded + in_flight, sharded, _adamw(sharded))


@pytest.mark.parametrize("fsdp, experts_dim", [(2, 0), (4, 1)], ids=["dim-0", "dim-1"])
def test_fsdp2_with_tp_shards_the_experts_over_the_ranks_holding_the_same(fsdp, experts_dim):
    tp = ep = 2
    efsdp = fsdp * tp // ep  # the ranks holding the same experts (torchtitan's sparse mesh)
    report = _rank(Layout(fsdp=fsdp, tp=tp, ep=ep))
    # 1. the rank's 2 experts per layer, (2, 2I, H) and (2, H, I), over efsdp ranks: on dim 0
    #    while efsdp x ep does not exceed the 4 experts; over 8 ranks on dim 1 (torchtitan's
    #    apply_fsdp: no padding), H / 4 and 2I / 4 rows each. On dim 0, 2 experts over 4 ranks
    #    would pad every shard to one expert: twice this.
    experts = LAYERS * EXPERTS_LAYER // ep // efsdp
    # 2. the rest: the tp rank's shards, then sharded over the fsdp ranks.
    sharded = (_dense_share(tp) // fsdp + experts) * FP32
    assert sharded == {0: (29504 // 2 + 49152) * 4, 1: (29504 // 4 + 24576) * 4}[experts_dim]
    # 3. in flight: the root's, one block's and its experts' all-gathered tp shards.
    in_flight = (_dense_share(tp) - LAYERS * (ATTENTION // tp + REPLICATED)
                 + ATTENTION // tp + REPLICATED + EXPERTS_LAYER // ep) * FP32
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (sharded + in_flight, sharded, _adamw(sharded))


#: Token copies per expert over one expert group: each of the 2 tp ranks routes its 32 of the
#: 64 tokens, top-2: 128 copies; rank 0's experts (0, 1) receive 32, rank 1's (2, 3) 96.
SKEWED_TP = [16, 16, 48, 48]
#: Inside FSDP2 each rank routes its whole batch: 2 x 64 x 2 = 256 copies; 64 against 192.
SKEWED = [32, 32, 96, 96]


@pytest.mark.parametrize("layout, routing, received", [
    (Layout(tp=2, ep=2), SKEWED_TP, (32, 96)),
    (Layout(fsdp=2, ep=2), SKEWED, (64, 192)),
], ids=["over-tp", "inside-fsdp"])
def test_the_dispatch_receives_the_copies_routed_to_the_ranks_experts(layout, routing, received):
    # Both ranks run the same shapes up to the first dispatch, whose output is the copies
    # routed to the rank's experts: received x H float32.
    first = [next(point for point in _rank(layout, rank, routing=routing).timeline
                  if point.op == "_c10d_functional.all_to_all_single.default")
             for rank in (0, 1)]
    assert first[0].index == first[1].index
    assert first[1].live.total - first[0].live.total == (received[1] - received[0]) * H * FP32


def test_every_rank_of_fsdp_tp_and_ep_is_reported_and_the_busiest_named():
    model, args, kwargs = mixtral()
    view = memory_ranks(model, args, kwargs, layout=Layout(fsdp=2, tp=2, ep=2),
                        routing=SKEWED_TP)
    # ep innermost: ranks 1 and 3 are rank 1 of their expert groups, which receive 96 copies.
    peaks = [report.peak_bytes for report in view.ranks]
    assert [report.rank for report in view.ranks] == [0, 1, 2, 3]
    assert peaks[0] == peaks[2] < peaks[1] == peaks[3]
    assert (view.peak_rank, view.peak_bytes) == (1, peaks[1])


def test_replicas_of_a_tensor_parallel_group_run_its_step():
    # Layout(dp=2, tp=2, ep=2): the expert groups are the tp groups (ep innermost); rank 2 is
    # rank 0 of the second replica.
    replica = _rank(Layout(dp=2, tp=2, ep=2), rank=2)
    assert (replica.world_size, replica.rank) == (4, 2)
    assert replica.peak_bytes == _rank(Layout(tp=2, ep=2), rank=0).peak_bytes


def test_a_checkpointed_block_of_a_rank_inside_fsdp2_over_tp_runs_its_all_to_alls_again():
    from exportflops.checkpointing import Blocks

    layout, both = Layout(fsdp=2, tp=2, ep=2), Blocks(checkpointed=["model.layers.0",
                                                                    "model.layers.1"])
    plain, wrapped = _rank(layout), _rank(layout, checkpoint=both)
    # Per MoE layer: the dispatch and the combine forward, their two gradients backward, and
    # with the block checkpointed (wrapped after the tp plan, before FSDP2) its forward again.
    all_to_alls = [sum(point.op == "_c10d_functional.all_to_all_single.default"
                       for point in report.timeline) for report in (plain, wrapped)]
    assert all_to_alls == [LAYERS * (2 + 2), LAYERS * (2 + 2 + 2)]
    assert wrapped.max_by_kind.parameters == plain.max_by_kind.parameters
    assert wrapped.max_by_kind.activations < plain.max_by_kind.activations


def _odd_batch():
    model, _, _ = mixtral()
    ids = torch.randint(0, VOCAB, (1, 3))
    return model, {"input_ids": ids, "labels": ids}


def test_a_batch_the_tensor_parallel_ranks_cannot_share_is_refused_by_name():
    model, kwargs = _odd_batch()
    with pytest.raises(InputError, match=r"MixtralForCausalLM: a batch of 3 tokens does not "
                                         r"split over 2 tensor-parallel ranks: pass a batch x "
                                         r"sequence that is a multiple of tp"):
        memory_ranks(model, (), kwargs, layout=Layout(tp=2, ep=2), rank=0)
