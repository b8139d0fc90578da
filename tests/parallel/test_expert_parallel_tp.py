"""Expert parallelism over the tensor-parallel ranks (``--ep N --tp N``, and inside FSDP2 ``--ep
E --tp T --fsdp F``, `exportflops.parallel.experts.tp`): torchtitan's layout with sequence
parallelism off (torchtitan/models/common/MOE_SHARDING.md, "EP on, SP off"), each tp rank
routing 1/tp of the batch's tokens, the rest by the model's own plan. Checked on transformers'
Mixtral (its default config: hidden 4096, expert FFN 14336, 8 experts, top 2, 32 heads of 128,
8 key/value heads, vocabulary 32000) on meta, 2 layers, one row of 32 tokens, against sizes
derived here."""

from __future__ import annotations

import json

import pytest
import torch

from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.records.experts import ExpertParallelReport
from tests.cli_support import one_paragraph

pytest.importorskip("transformers")

TP = 2
HIDDEN, FFN, EXPERTS, TOP_K, LAYERS, SEQ = 4096, 14336, 8, 2, 2, 32
F32 = 4
#: Tokens each tp rank routes: its half of the row.
SHARE = SEQ // TP  # 16
#: Token copies each rank's experts receive under balanced routing: its own share's.
COPIES = SHARE * TOP_K  # 32
#: One token copy in one Mixtral expert: gate and up (H -> F each), then down (F -> H).
MACS_PER_COPY = 3 * HIDDEN * FFN  # 176,160,768
#: What one all-to-all carries: a rank's 32 copies of a 4096-float32 token.
MESSAGE = COPIES * HIDDEN * F32  # 524,288
#: The whole row's hidden state, (32, 4096) float32: what the MoE's all-reduce sums and what
#: the backward all-gathers its inputs' gradients to.
ROW = SEQ * HIDDEN * F32  # 524,288
MIXTRAL = ["hf:mixtral", "--layers", str(LAYERS), "--seq", str(SEQ)]


def _split(*, mode: str = "forward", rank: int = 0, routing: list[int] | None = None,
           sizes: dict | None = None, **degrees: int):
    """(rank ``rank``'s report, the record of every rank) of Mixtral (``sizes``: `hf.build`'s,
    default 2 layers, 32 tokens) on ``Layout(**degrees)``: the library calls the command's
    ``hf:mixtral --layers 2 --seq 32`` makes (the single-device count decided on cpu where meta
    cannot decide a branch)."""
    from exportflops import hf
    from exportflops.parallel import Layout
    from exportflops.parallel.experts.ranks import analyze_expert_ranks, expert_rank_report

    sizes = sizes or {"layers": LAYERS, "seq": SEQ}
    record, counted = analyze_expert_ranks(
        *hf.build("mixtral", **sizes), layout=Layout(**degrees), mode=mode, routing=routing,
        single_device=hf.analyze("mixtral", mode=mode, **sizes))
    return expert_rank_report(record, counted, rank), record


@pytest.fixture(scope="module")
def train():
    return _split(ep=2, tp=TP, mode="train", rank=1)


@pytest.fixture(scope="module")
def forward():
    return _split(ep=2, tp=TP)[1]


def test_each_rank_routes_its_half_of_the_tokens_to_its_experts(forward):
    assert (forward.tp, forward.ep, forward.tokens) == (TP, TP, SHARE)
    for rank in forward.ranks:
        assert rank.routed_tokens == COPIES
        assert rank.expert.macs == LAYERS * COPIES * MACS_PER_COPY
        assert all(c.bytes == MESSAGE for c in rank.all_to_alls)
        assert len(rank.all_to_alls) == 2 * LAYERS  # dispatch and combine per layer


def test_the_tp_ranks_share_one_batchs_matmuls_exactly(forward, train):
    """Mixtral's plan shards attention, the embedding and the head; the MoE shares out the
    tokens: every multiply-accumulate of the batch is done once, on one of the 2 ranks."""
    for record in (forward, train[1]):
        assert {r.total.macs for r in record.ranks} == {record.single_device.macs // TP}
        assert record.single_device.macs % TP == 0


def test_the_moe_sums_its_routed_output_and_gathers_its_inputs_gradients(train):
    _, record = train
    moe = [(c.op, c.phase, c.module, c.bytes) for c in record.tp_collectives
           if ".mlp." in c.module]
    for layer in range(LAYERS):
        path = f"model.layers.{layer}.mlp"
        # forward: the experts' output, the rank's rows among zeros, summed over the 2 ranks
        assert moe.count(("all_reduce", "forward", f"{path}.token_sum", ROW)) == 1
        # backward: the router's and the experts' input gradients, gathered to the whole row
        assert moe.count(("all_gather", "backward", f"{path}.token_share", ROW)) == 2
    assert len(moe) == 4 * LAYERS  # and the router's weight gradient's all-reduce (below)
    assert all(c.mesh_dim == "tp" and c.group_size == TP for c in record.tp_collectives)


def test_the_routers_gradient_a_partial_sum_over_the_ranks_is_all_reduced(train):
    """Each rank's router (8 x 4096 float32) saw its own 16 tokens: one backward all-reduce
    of its weight's gradient per layer, last layer first."""
    _, record = train
    reductions = [(c.module, c.bytes, c.phase) for c in record.tp_collectives
                  if c.node == "weight gradient"]
    assert reductions == [(f"model.layers.{layer}.mlp.gate", EXPERTS * HIDDEN * F32, "backward")
                          for layer in reversed(range(LAYERS))]


def test_two_rows_are_shared_out_as_one_run_of_tokens():
    """A batch of 2 rows of 16: each rank routes 16 of the 32 tokens."""
    _, record = _split(ep=2, tp=TP, sizes={"layers": 1, "batch": 2, "seq": 16})
    assert record.tokens == 16
    assert [r.routed_tokens for r in record.ranks] == [COPIES, COPIES]
    assert {r.total.macs for r in record.ranks} == {record.single_device.macs // TP}


def test_the_router_and_the_experts_do_only_their_own_work_on_the_ranks_share():
    """The router (4096 -> 8 experts) on 16 tokens: forward, and in training the input's and
    the weight's gradients, each as many MACs. The experts' module holds no collective and none
    of the sharing's ops: those are token_share's and token_sum's."""
    from exportflops.cli.options import check, parser
    from exportflops.cli.targets import hf_options
    from exportflops.targets import build_target
    from exportflops.parallel import Layout
    from exportflops.parallel.per_rank import rank_of

    ns = parser().parse_args([*MIXTRAL, "--ep", "2", "--tp", "2", "--mode", "train"])
    check(ns)

    def build(device):
        return build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                            hf_options=hf_options(ns))

    _, rank = rank_of(build, (), None, Layout(tp=TP), rank=0, experts="experts", mode="train")
    assert rank.module("model.layers.0.mlp.gate").inclusive.macs == 3 * SHARE * HIDDEN * EXPERTS
    experts = [n for n in rank.nodes if n.module.startswith("model.layers.0.mlp.experts")
               and n.phase == "forward"]  # (the experts' own backward makes zeros and cats)
    assert experts and not any(n.op in ("aten.cat.default", "aten.new_zeros.default")
                               for n in experts)
    assert not any(c.module.endswith(".experts") for c in rank.collectives)


def test_a_skewed_routing_names_the_busiest_rank(train):
    # 64 copies over the group's two shares: experts 0-3 on rank 0 get 10, 4-7 on rank 1 get 54
    from exportflops.render.experts import experts_view

    _, record = _split(ep=2, tp=TP, routing=[1, 2, 3, 4, 10, 14, 15, 15])
    assert [r.routed_tokens for r in record.ranks] == [10, 54]
    assert record.busiest_rank == 1
    assert record.ranks[1].expert.macs == LAYERS * 54 * MACS_PER_COPY
    assert "Rank 1 is the busiest" in experts_view(record, rank=0)


def test_the_commands_rank_report_carries_every_collective_of_the_rank(train):
    report, record = train
    assert (report.world_size, report.rank) == (TP, 1)
    assert report.total.macs == record.single_device.macs // TP  # the rank's own count
    assert report.collectives == record.collectives(1)
    assert {c.op for c in report.collectives} == {"all_reduce", "all_gather", "all_to_all"}


def test_the_record_round_trips_and_the_view_lists_the_tp_collectives(train):
    _, record = train
    assert ExpertParallelReport.model_validate_json(record.model_dump_json()) == record
    from exportflops.render.experts import experts_view

    text = experts_view(record, rank=1)
    assert "Tensor-parallel collectives of rank 1" in text
    assert "tensor-parallel share of one batch's work" in text


def test_the_command_writes_the_record_analyze_ranks_makes(capsys):
    from exportflops import hf
    from exportflops.parallel import Layout, analyze_ranks

    assert main([*MIXTRAL, "--ep", "2", "--tp", "2", "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["tp"], record["tokens"]) == (TP, SHARE)
    # The command's hf: policy: the single-device count decided on cpu where meta cannot.
    sizes = {"layers": LAYERS, "seq": SEQ}
    python = analyze_ranks(*hf.build("mixtral", **sizes), layout=Layout(tp=TP, ep=2),
                           single_device=hf.analyze("mixtral", **sizes))
    assert json.loads(python.model_dump_json()) == record


@pytest.mark.parametrize("flags, message", [
    (["--ep", "2", "--tp", "4"], "--ep equal to --tp"),
    (["--ep", "8", "--tp", "2", "--fsdp", "2"], "ep 8 does not divide fsdp x cp x tp = 4"),
    (["--ep", "2", "--tp", "2", "--pp", "2"], "--pp"),
])
def test_flags_outside_the_layout_are_usage_errors(flags, message, capsys):
    assert main([*MIXTRAL, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and one_paragraph(err)


def test_a_token_count_the_ranks_cannot_share_is_refused(capsys):
    assert main(["hf:mixtral", "--layers", "1", "--seq", "3", "--ep", "2", "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert "multiple of" in err and one_paragraph(err)


def test_expert_parallel_needs_tp_equal_to_ep_and_the_single_device_report():
    from exportflops import hf
    from exportflops.parallel.experts.analysis import expert_parallel

    report = hf.analyze("mixtral", layers=LAYERS, seq=SEQ)  # the batch's single-device count
    sizes = dict(top_k=TOP_K, num_experts=EXPERTS, hidden=HIDDEN, tokens=SEQ,
                 dtype=torch.float32)
    with pytest.raises(InputError, match="ep equal to tp"):
        expert_parallel(report, ep=2, tp=4, single_device=report, **sizes)
    with pytest.raises(InputError, match="ep 8 does not divide fsdp x cp x tp = 4"):
        expert_parallel(report, ep=8, tp=2, fsdp=2, single_device=report, **sizes)
    with pytest.raises(InputError, match="single_device="):
        expert_parallel(report, ep=2, tp=2, **sizes)


class _Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4, 8, 8))


class _Unrouted(torch.nn.Module):
    """An MoE layer whose router is named neither gate nor router."""

    def __init__(self):
        super().__init__()
        self.experts, self.picker = _Experts(), torch.nn.Linear(8, 4)


@pytest.mark.parametrize("model, message", [
    (torch.nn.Sequential(_Unrouted()), "no router module named gate or router"),
    (torch.nn.Linear(8, 8), "no module named 'experts'"),
], ids=["no-router", "no-experts"])
def test_a_model_whose_tokens_cannot_be_shared_out_is_refused_naming_why(model, message):
    from torch.distributed.device_mesh import init_device_mesh

    from exportflops.parallel.token_shares import route_token_shares
    from exportflops.count.ranks import fake_process_group

    with fake_process_group(2), pytest.raises(InputError, match=message):
        route_token_shares(model, init_device_mesh("cpu", (2,)))


#: Mixtral's plan at tp 2 (q, k, v column-wise, o row-wise): each rank's halves of q and o
#: (4096 x 4096), of k and v (1024 x 4096); the router (8 x 4096) and two RMSNorm weights whole.
BLOCK_SHARD = 2 * (4096 * 4096 // 2) + 2 * (1024 * 4096 // 2) + EXPERTS * HIDDEN + 2 * HIDDEN
#: The root's: the embedding's and the head's halves of the vocabulary (32000 x 4096 each), the
#: final norm whole.
ROOT_SHARD = 2 * (32000 // 2 * HIDDEN) + HIDDEN
#: A rank's 4 experts (8 / ep 2): gate and up stacked (4, 2 x 14336, 4096), down (4, 4096, 14336).
LOCAL_EXPERTS = 4 * (2 * FFN * HIDDEN + HIDDEN * FFN)


@pytest.fixture(scope="module")
def inside_fsdp():
    return _split(ep=2, tp=TP, fsdp=2, mode="train")[1]


def test_inside_fsdp_fsdp2_gathers_each_blocks_tp_shards_and_the_ranks_experts(inside_fsdp):
    """torchtitan's mesh: (fsdp 2, tp 2) dense, tp innermost; (efsdp 2, ep 2) sparse, ep
    innermost. FSDP2 shards each block's tensor-parallel shards over the 2 ranks of a tp index,
    a rank's experts over the 4 / 2 ranks holding them, the root's shards over the fsdp ranks."""
    gathers = {c.module: (c.bytes, c.mesh_dim, c.group_size)
               for c in inside_fsdp.fsdp_collectives if c.phase == "forward"}
    assert gathers == {
        "": (ROOT_SHARD * F32, "fsdp", 2),                                    # 524,304,384
        "model.layers.0": (BLOCK_SHARD * F32, "fsdp", 2),                     # 84,049,920
        "model.layers.1": (BLOCK_SHARD * F32, "fsdp", 2),
        "model.layers.0.mlp.experts": (LOCAL_EXPERTS * F32, "efsdp", 2),      # 2,818,572,288
        "model.layers.1.mlp.experts": (LOCAL_EXPERTS * F32, "efsdp", 2)}
    scatters = {c.module: (c.bytes, c.mesh_dim) for c in inside_fsdp.fsdp_collectives
                if c.op == "reduce_scatter"}  # each unit's gradients, as it gathered them
    assert scatters == {module: (size, dim) for module, (size, dim, _) in gathers.items()}
    assert all(c.mesh_dim in ("fsdp", "efsdp") for c in inside_fsdp.fsdp_collectives)
    assert inside_fsdp.world_size() == 4
    assert inside_fsdp.fsdp_group(3) == [1, 3] and inside_fsdp.efsdp_group(3) == [1, 3]
    assert inside_fsdp.ep_group(3) == [2, 3]


def test_inside_fsdp_each_rank_does_the_work_of_its_place_over_tp(inside_fsdp, train):
    """FSDP2 moves parameters, not FLOPs: rank r works as rank r mod ep without FSDP2."""
    _, alone = train
    for rank in inside_fsdp.ranks:
        same = alone.ranks[rank.rank % 2]
        assert (rank.expert, rank.rest, rank.all_to_alls) == (same.expert, same.rest,
                                                             same.all_to_alls)


def test_inside_fsdp_over_tp_4_the_experts_group_spans_4_ranks_and_the_blocks_2():
    """ep 2 over fsdp 2 x tp 4: a block's tp-4 shards over the 2 ranks of a tp index, a rank's
    4 experts over the 8 / 2 ranks holding them."""
    _, record = _split(ep=2, tp=4, fsdp=2, rank=5, sizes={"layers": 1, "seq": 32})
    block = 2 * (4096 * 4096 // 4) + 2 * (1024 * 4096 // 4) + EXPERTS * HIDDEN + 2 * HIDDEN
    root = 2 * (32000 // 4 * HIDDEN) + HIDDEN
    gathers = {c.module: (c.bytes, c.mesh_dim, c.group_size) for c in record.fsdp_collectives}
    assert gathers == {"": (root * F32, "fsdp", 2),                            # 262,160,384
                       "model.layers.0": (block * F32, "fsdp", 2),             # 42,106,880
                       "model.layers.0.mlp.experts": (LOCAL_EXPERTS * F32, "efsdp", 4)}
    assert record.fsdp_group(5) == [1, 5] and record.efsdp_group(5) == [1, 3, 5, 7]
    assert record.tokens == 32 // 4


def test_fsdp_collectives_take_tp_and_its_layout_together():
    from exportflops.parallel.experts.fsdp import fsdp_collectives

    model = torch.nn.Sequential(_Unrouted())
    with pytest.raises(InputError, match="go together"):
        fsdp_collectives(model, (torch.zeros(2, 8),), ep=2, fsdp=2, num_experts=4, tp=2)
