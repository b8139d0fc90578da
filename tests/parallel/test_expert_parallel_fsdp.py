"""Expert parallelism inside FSDP2 (torchtitan's "ep inside fsdp", `analyze_experts(fsdp=)`,
``--ep E --fsdp F``): each of the F ranks does the work of its place in its expert-parallel
group, and FSDP2's all-gathers and reduce-scatters, traced from real FSDP2 on a fake copy,
carry the blocks' other parameters over all F ranks and the rank's own experts over the F / E
ranks that hold them; checked on the hand-written 2-layer mixture of experts of
test_expert_parallel against sizes derived here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.parallel.experts import analyze_experts
from exportflops.records.experts import ExpertParallelReport
from exportflops.render.experts import experts_view
from tests.cli_support import one_paragraph
from tests.parallel.test_expert_parallel import E, F, H, loaded_models, written_models

EP, FSDP = 2, 4
F32 = 4  # bytes of a float32
#: One MoE layer's parameters outside the experts: the router, nn.Linear(H, E, bias=False).
ROUTER_PARAMS = E * H  # 32
#: One expert's parameters: up (H, F) and down (F, H).
EXPERT_PARAMS = H * F + F * H  # 256
#: The experts one rank holds: E / ep of them (torchtitan's ExpertParallel, dim 0).
LOCAL_EXPERTS = E // EP  # 2


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    return written_models(tmp_path_factory.mktemp("moe_fsdp"))


@pytest.fixture(scope="module")
def hand(models_file):
    return loaded_models(models_file).build(torch.device("cpu"))


@pytest.fixture(scope="module")
def train(hand):
    model, args = hand
    return analyze_experts(model, args, ep=EP, fsdp=FSDP, mode="train")


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("routing", [None, [4, 4, 20, 4]], ids=["balanced", "skewed"])
def test_each_fsdp_rank_does_the_work_of_its_place_in_its_expert_parallel_group(
        hand, mode, routing):
    """FSDP2 moves parameters, not FLOPs: rank r's work and all-to-alls are those of rank
    r mod ep when expert parallelism stands alone."""
    model, args = hand
    alone = analyze_experts(model, args, ep=EP, mode=mode, routing=routing)
    inside = analyze_experts(model, args, ep=EP, fsdp=FSDP, mode=mode, routing=routing)
    assert [r.rank for r in inside.ranks] == [0, 1, 2, 3]
    for rank in inside.ranks:
        same = alone.ranks[rank.rank % EP]
        assert rank.ep_rank == same.rank
        assert (rank.first_expert, rank.last_expert) == (same.first_expert, same.last_expert)
        assert (rank.expert, rank.rest, rank.total) == (same.expert, same.rest, same.total)
        assert rank.all_to_alls == same.all_to_alls
    assert inside.busiest_rank == alone.busiest_rank


def test_torchtitans_layout_groups_consecutive_ranks_for_ep_and_strided_ones_for_efsdp(train):
    # The sparse mesh (efsdp 2, ep 2), ep innermost: rank 3 is (1, 1).
    assert train.ep_group(3) == [2, 3] and train.ep_group(0) == [0, 1]
    assert train.efsdp_group(3) == [1, 3] and train.efsdp_group(2) == [0, 2]
    assert train.world_size() == FSDP


def test_fsdp_gathers_the_router_over_4_ranks_and_the_ranks_2_experts_over_2(hand):
    model, args = hand
    record = analyze_experts(model, args, ep=EP, fsdp=FSDP)
    # Forward: each block's unit gathers its router, then its experts' unit the rank's experts.
    assert [(c.module, c.op, c.mesh_dim, c.group_size) for c in record.fsdp_collectives] == [
        ("layers.0", "all_gather", "fsdp", 4), ("layers.0.experts", "all_gather", "efsdp", 2),
        ("layers.1", "all_gather", "fsdp", 4), ("layers.1.experts", "all_gather", "efsdp", 2)]
    router, experts = record.fsdp_collectives[:2]
    assert router.bytes == ROUTER_PARAMS * F32  # 128: 32 float32s, 4 rows of the 4 ranks' 1
    assert experts.bytes == LOCAL_EXPERTS * EXPERT_PARAMS * F32  # 2048
    assert router.bandwidth_factor == 3 / 4 and experts.bandwidth_factor == 1 / 2  # (n-1)/n
    assert {c.phase for c in record.fsdp_collectives} == {"forward"}


def test_in_training_each_unit_gathers_again_and_reduce_scatters_its_gradients(train):
    """Blocks reshard after forward (FSDP2's default, torchtitan's without pp): the backward
    gathers each unit once more, and reduce-scatters its gradients, of its parameters' size."""
    backward = [c for c in train.fsdp_collectives if c.phase == "backward"]
    for unit, size, dim in (("layers.0", ROUTER_PARAMS * F32, "fsdp"),
                            ("layers.1", ROUTER_PARAMS * F32, "fsdp"),
                            ("layers.0.experts", LOCAL_EXPERTS * EXPERT_PARAMS * F32, "efsdp"),
                            ("layers.1.experts", LOCAL_EXPERTS * EXPERT_PARAMS * F32, "efsdp")):
        calls = sorted((c.op, c.bytes, c.mesh_dim) for c in backward if c.module == unit)
        assert calls == [("all_gather", size, dim), ("reduce_scatter", size, dim)], unit
    # Per layer: forward 128 + 2048, backward twice that.
    total = sum(c.bytes for c in train.fsdp_collectives)
    assert total == 2 * 3 * (ROUTER_PARAMS + LOCAL_EXPERTS * EXPERT_PARAMS) * F32  # 13056


def test_past_one_rank_per_expert_the_experts_shard_on_dim_1_and_fsdp_pads_the_router(hand):
    """fsdp 8 > 4 experts: torchtitan shards the experts on dim 1 (up (2, 8, 16) and down
    (2, 16, 8) split 4 ways with no padding); the router's 4 rows are padded to 8 so each of
    the 8 ranks holds one (FSDP2 pads dim 0 to a multiple of the group)."""
    model, args = hand
    record = analyze_experts(model, args, ep=EP, fsdp=8)
    router, experts = record.fsdp_collectives[:2]
    assert (router.group_size, router.bytes) == (8, 8 * H * F32)  # 256: 8 padded rows of H
    assert (experts.group_size, experts.bytes) == (4, LOCAL_EXPERTS * EXPERT_PARAMS * F32)
    assert record.efsdp_group(5) == [1, 3, 5, 7]


def test_with_fsdp_equal_to_ep_each_rank_holds_its_experts_whole_and_never_gathers_them(hand):
    """fsdp 2 = ep 2: each efsdp group is one rank, so FSDP2 has nothing of the experts to
    gather or reduce; the routers still go over both ranks (32 float32s each)."""
    model, args = hand
    record = analyze_experts(model, args, ep=EP, fsdp=EP, mode="train")
    assert {c.mesh_dim for c in record.fsdp_collectives} == {"fsdp"}
    assert {(c.bytes, c.group_size) for c in record.fsdp_collectives} == {(ROUTER_PARAMS * F32,
                                                                          2)}
    assert len(record.fsdp_collectives) == 2 * 3  # per layer: 2 all-gathers, 1 reduce-scatter


def test_a_rank_lists_fsdps_collectives_and_its_all_to_alls_forward_first(train):
    listed = train.collectives(3)
    assert len(listed) == len(train.fsdp_collectives) + len(train.ranks[3].all_to_alls)
    phases = [c.phase for c in listed]
    assert phases == sorted(phases, key=lambda phase: phase == "backward")
    assert {c.mesh_dim for c in listed} == {"fsdp", "efsdp", "ep"}


def test_fsdp_not_a_multiple_of_ep_is_refused_naming_both(hand):
    model, args = hand
    with pytest.raises(InputError, match=r"ep 2 does not divide fsdp x cp x tp = 3"):
        analyze_experts(model, args, ep=EP, fsdp=3)


def test_the_callers_model_is_left_as_it_was(hand):
    from torch.distributed.fsdp import FSDPModule

    model, args = hand
    shapes = [tuple(p.shape) for p in model.parameters()]
    analyze_experts(model, args, ep=EP, fsdp=FSDP, mode="train")
    assert [tuple(p.shape) for p in model.parameters()] == shapes
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_the_record_round_trips_and_its_view_lists_the_fsdp_collectives(train):
    assert ExpertParallelReport.model_validate_json(train.model_dump_json()) == train
    text = experts_view(train, rank=3)
    assert "inside 4 FSDP2 ranks" in text
    assert "FSDP2 collectives of rank 3" in text
    assert "#1 of expert-parallel group 2-3" in text
    assert text.count("reduce_scatter") == 4


def test_a_record_written_before_fsdp_composed_reads_each_ranks_ep_rank_as_its_rank(hand):
    model, args = hand
    alone = analyze_experts(model, args, ep=EP).model_dump(mode="json")
    for rank in alone["ranks"]:
        del rank["ep_rank"]  # the layout before FSDP2 composed: ranks 0 .. ep - 1 only
    read = ExpertParallelReport.model_validate(alone)
    assert [r.ep_rank for r in read.ranks] == [r.rank for r in read.ranks] == list(range(EP))


def test_every_fsdp_rank_is_reported(models_file):
    from exportflops.parallel import Layout, analyze_ranks

    # on meta, as the command builds `file.py:build` for --ep 2 --fsdp 4
    model, args = loaded_models(models_file).build(torch.device("meta"))
    record = json.loads(analyze_ranks(model, args, layout=Layout(fsdp=4, ep=2)).model_dump_json())
    assert (record["ep"], record["fsdp"], len(record["ranks"])) == (2, 4, 4)
    assert record["ranks"][3]["ep_rank"] == 1
    gathers = [c for c in record["fsdp_collectives"] if c["op"] == "all_gather"]
    assert [c["bytes"] for c in gathers] == [128, 2048, 128, 2048]


def test_python_m_exportflops_runs_ep_inside_fsdp(models_file):
    done = subprocess.run([sys.executable, "-m", "exportflops", f"{models_file}:build", "--ep",
                           "2", "--fsdp", "4", "--rank", "3", "--mode", "train"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "FSDP2 collectives of rank 3" in done.stdout
    assert "All-to-alls of rank 3 (#1 of expert-parallel group 2-3)" in done.stdout


@pytest.mark.parametrize("flags, message", [
    (["--ep", "2", "--fsdp", "3"], "--fsdp 3 --ep 2: Layout(fsdp=3, ep=2): ep 2 does not divide "
                                  "fsdp x cp x tp = 3"),
    (["--ep", "2", "--fsdp", "4", "--rank", "4"], "--rank one of 0..3"),
    (["--ep", "2", "--fsdp", "4", "--tp", "2"], "has no tensor-parallel plan"),
], ids=["fsdp-not-a-multiple", "rank-past-fsdp", "with-tp"])
def test_bad_ep_inside_fsdp_flags_are_usage_errors(models_file, capsys, flags, message):
    assert main([f"{models_file}:build", *flags]) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip() and message in stderr, stderr


def test_tiny_mixtral_fsdp_collectives_by_hand():
    """A transformers Mixtral on meta (its grouped-mm experts traced as batched_mm on the fake
    copy): per block the attention, router and norms over 4 ranks and 2 of its 4 experts over 2;
    the root's embedding, final norm and head over 4."""
    from transformers import MixtralConfig, MixtralForCausalLM

    hidden, ffn, vocab = 16, 32, 64
    config = MixtralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = MixtralForCausalLM(config).eval()
    args = (torch.zeros(2, 8, dtype=torch.int64, device="meta"),)
    record = analyze_experts(model, args, ep=EP, fsdp=FSDP)  # no KV cache: FSDP2's tracing
    # takes tensors and their containers as outputs, not a transformers cache
    # head_dim 16 / 2 heads = 8: q and o 16 x 16, k and v 16 x (1 kv head x 8); the router
    # 4 x 16; two RMSNorm weights of 16. Every dim 0 (16, 8, 4) splits 4 ways unpadded.
    block = 2 * hidden * hidden + 2 * hidden * 8 + 4 * hidden + 2 * hidden  # 864
    # An expert: gate and up (2F, H) stacked, down (H, F).
    expert = 2 * ffn * hidden + hidden * ffn  # 1536
    root = vocab * hidden + hidden + vocab * hidden  # 2064: embedding, final norm, head
    gathers = {c.module: (c.bytes, c.mesh_dim, c.group_size) for c in record.fsdp_collectives}
    assert gathers == {
        "": (root * F32, "fsdp", 4),                                           # 8256
        "model.layers.0": (block * F32, "fsdp", 4),                            # 3456
        "model.layers.1": (block * F32, "fsdp", 4),
        "model.layers.0.mlp.experts": (LOCAL_EXPERTS * expert * F32, "efsdp", 2),  # 12288
        "model.layers.1.mlp.experts": (LOCAL_EXPERTS * expert * F32, "efsdp", 2)}
    assert len(record.fsdp_collectives) == 5  # forward: one all-gather per unit


def test_a_ranks_report_carries_the_ranks_collectives(models_file):
    """Rank R's report (what the collectives view of a rank reads): world size F, rank R, and
    every collective R issues: its 4 all-to-alls and FSDP2's 4 all-gathers (forward)."""
    from exportflops.parallel import Layout, analyze_ranks

    model, args = loaded_models(models_file).build(torch.device("meta"))
    layout = Layout(fsdp=FSDP, ep=EP)
    record = analyze_ranks(model, args, layout=layout)
    report = analyze_ranks(model, args, layout=layout, rank=3)
    assert (report.world_size, report.rank) == (4, 3)
    assert report.collectives == record.collectives(3)
    assert sorted(c.op for c in report.collectives) == ["all_gather"] * 4 + ["all_to_all"] * 4
