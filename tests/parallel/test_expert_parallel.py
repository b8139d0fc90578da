"""Expert parallelism per rank (`exportflops.parallel.experts`): each rank's expert work for the
token copies routed to its experts, the rest of its work, and its dispatch and combine
all-to-alls, checked against derivations written out here, on a hand-written 2-layer mixture of
experts and on a tiny transformers Mixtral; then the command's --ep, --routing and --rank."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest
import torch

from exportflops import Cost, analyze
from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.parallel.experts import analyze_experts
from exportflops.records.experts import ExpertParallelReport
from exportflops.render.experts import experts_view
from tests.cli_support import one_paragraph

# The hand model: E = 4 experts per layer, top_k = 2, hidden H = 8, expert width F = 16, two
# MoE layers; its example batch is (2, 4, H): T = 8 tokens.
E, TOP_K, H, F, T = 4, 2, 8, 16, 8
#: One routed token copy in one expert: (1, H) @ (H, F) up, then (1, F) @ (F, H) down.
MACS_PER_COPY = H * F + F * H  # 256
#: The router of one layer: (T, H) @ (H, E).
ROUTER_MACS = T * H * E  # 256
#: What one all-to-all of a rank's own copies carries: T tokens x top_k copies x H float32s.
COPIES_BYTES = T * TOP_K * H * 4  # 512

MODELS = textwrap.dedent("""
    from types import SimpleNamespace

    import torch
    from torch import nn


    class Experts(nn.Module):
        def __init__(self, num_experts, hidden, ffn):
            super().__init__()
            self.up = nn.Parameter(torch.randn(num_experts, hidden, ffn) / hidden ** 0.5)
            self.down = nn.Parameter(torch.randn(num_experts, ffn, hidden) / ffn ** 0.5)

        def forward(self, copies, expert):  # (T*k, H), (T*k,): each copy through its expert
            h = torch.bmm(copies.unsqueeze(1), self.up[expert]).relu()  # (T*k, 1, F)
            return torch.bmm(h, self.down[expert]).squeeze(1)            # (T*k, H)


    class MoE(nn.Module):
        def __init__(self, num_experts, top_k, hidden, ffn):
            super().__init__()
            self.top_k = top_k
            self.gate = nn.Linear(hidden, num_experts, bias=False)
            self.experts = Experts(num_experts, hidden, ffn)

        def forward(self, x):  # (T, H)
            weights, expert = self.gate(x).softmax(-1).topk(self.top_k, dim=-1)  # (T, k)
            copies = x.unsqueeze(1).expand(-1, self.top_k, -1).reshape(-1, x.shape[-1])
            out = self.experts(copies, expert.reshape(-1)).view(*weights.shape, -1)
            return (out * weights.unsqueeze(-1)).sum(1)


    class TwoLayerMoE(nn.Module):
        def __init__(self, num_experts=4, top_k=2, hidden=8, ffn=16):
            super().__init__()
            # What a transformers config names: analyze_experts reads top_k, E and H from it.
            self.config = SimpleNamespace(num_experts_per_tok=top_k,
                                          num_local_experts=num_experts, hidden_size=hidden)
            self.layers = nn.ModuleList(MoE(num_experts, top_k, hidden, ffn) for _ in range(2))

        def forward(self, x):  # (B, S, H)
            h = x.reshape(-1, x.shape[-1])
            for layer in self.layers:
                h = h + layer(h)
            return h.view_as(x)


    def build(device):
        torch.manual_seed(0)
        return TwoLayerMoE().to(device), (torch.randn(2, 4, 8, device=device),)
""")


def written_models(folder) -> object:
    """`MODELS` as ``folder/moe_models.py`` (for the command's ``file.py:build``)."""
    path = folder / "moe_models.py"
    path.write_text(MODELS)
    return path


def loaded_models(path) -> object:
    """The module `written_models` wrote, imported."""
    spec = importlib.util.spec_from_file_location(f"moe_models_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    return written_models(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def hand(models_file):
    return loaded_models(models_file).build(torch.device("cpu"))


def _all_costs_equal(a: Cost, b: Cost) -> bool:
    return all(getattr(a, name) == getattr(b, name) for name in Cost.model_fields)


def test_balanced_routing_gives_each_rank_its_experts_share_and_the_all_to_all_bytes(hand):
    model, args = hand
    result = analyze_experts(model, args, ep=2)
    assert (result.num_experts, result.top_k, result.hidden, result.tokens) == (E, TOP_K, H, T)
    assert result.layers == ["layers.0.experts", "layers.1.experts"]
    # 2 ranks x T tokens x top_k copies = 32 copies per layer, 8 per expert.
    assert result.routing == [8, 8, 8, 8]
    for rank in result.ranks:
        # Rank r holds experts 2r and 2r + 1: 16 copies per layer, 256 MACs each, 2 layers.
        assert (rank.first_expert, rank.last_expert) == (2 * rank.rank, 2 * rank.rank + 1)
        assert rank.routed_tokens == 16
        assert rank.expert.macs == 2 * 16 * MACS_PER_COPY  # 8192
        # Outside the experts only the two routers contract.
        assert rank.rest.macs == 2 * ROUTER_MACS  # 512
        # Forward: per layer a dispatch of its own copies and a combine of the copies its
        # experts ran (16 x H float32s, the same 512 bytes when balanced).
        assert [(c.module, c.node, c.phase) for c in rank.all_to_alls] == [
            ("layers.0.experts", "token_dispatch", "forward"),
            ("layers.0.experts", "token_combine", "forward"),
            ("layers.1.experts", "token_dispatch", "forward"),
            ("layers.1.experts", "token_combine", "forward")]
        for c in rank.all_to_alls:
            assert (c.op, c.mesh_dim, c.group_size, c.dtype) == ("all_to_all", "ep", 2, "float32")
            assert c.bytes == COPIES_BYTES
            assert c.bandwidth_factor == 0.5  # (n - 1) / n of it leaves the rank, n = 2


def test_balanced_ranks_each_compute_exactly_one_batch_on_one_device(hand):
    """The all-to-alls move tokens, not FLOPs: with balanced routing a rank's experts run as
    many copies as its own batch routes, so its total is the single-device count."""
    model, args = hand
    single = analyze(model, args).total
    result = analyze_experts(model, args, ep=2)
    assert _all_costs_equal(result.single_device, single)
    for rank in result.ranks:
        assert _all_costs_equal(rank.total, single)


def test_a_skewed_histogram_names_the_busiest_rank_and_scales_its_expert_work(hand):
    model, args = hand
    # 32 copies per layer over both ranks' batches; expert 2 (rank 1) gets 20 of them.
    result = analyze_experts(model, args, ep=2, routing=[4, 4, 20, 4])
    rank0, rank1 = result.ranks
    assert (rank0.routed_tokens, rank1.routed_tokens) == (4 + 4, 20 + 4)
    assert result.busiest_rank == 1
    assert rank1.expert.macs == 2 * 24 * MACS_PER_COPY  # 12288
    assert rank0.expert.macs == 2 * 8 * MACS_PER_COPY   # 4096
    assert rank0.rest == rank1.rest  # each rank's own batch outside the experts
    # Rank 1 sends out its own 16 copies and sends back the 24 its experts ran.
    dispatch, combine = rank1.all_to_alls[:2]
    assert (dispatch.bytes, combine.bytes) == (COPIES_BYTES, 24 * H * 4)  # 512, 768
    assert rank0.all_to_alls[1].bytes == 8 * H * 4  # 256
    # Copies are moved, not made: the ranks' expert work adds up to two batches' worth.
    single_experts = 2 * T * TOP_K * MACS_PER_COPY
    assert rank0.expert.macs + rank1.expert.macs == 2 * single_experts
    assert not result.balanced


def test_train_mode_adds_the_backward_and_its_two_all_to_alls_per_layer(hand):
    model, args = hand
    result = analyze_experts(model, args, ep=2, mode="train")
    bmm = 16 * H * F  # one of a rank's expert bmms on its 16 copies per layer: 2048 MACs
    # Forward: 2 bmms per layer. The backward of each bmm computes its input's gradient and its
    # weights' gradient, one bmm of the forward's size each; layer 0's copies are the model's
    # input, which needs no gradient, so its first bmm computes only the weights' gradient.
    layer1 = 2 * bmm + 4 * bmm  # 12288
    layer0 = 2 * bmm + 3 * bmm  # 10240
    for rank in result.ranks:
        assert rank.expert.macs == layer0 + layer1  # 22528
        assert [(c.module, c.node, c.phase) for c in rank.all_to_alls[4:]] == [
            ("layers.1.experts", "token_combine_backward", "backward"),
            ("layers.1.experts", "token_dispatch_backward", "backward"),
            ("layers.0.experts", "token_combine_backward", "backward"),
            ("layers.0.experts", "token_dispatch_backward", "backward")]
        assert all(c.bytes == COPIES_BYTES for c in rank.all_to_alls)
        assert _all_costs_equal(rank.total, analyze(model, args, mode="train").total)
    skewed = analyze_experts(model, args, ep=2, mode="train", routing=[4, 4, 20, 4])
    # 24 of a balanced 16 copies on rank 1: 3/2 of its balanced expert work.
    assert skewed.ranks[1].expert.macs == (layer0 + layer1) * 24 // 16  # 33792
    assert skewed.busiest_rank == 1


@pytest.mark.parametrize("ep, routing, message", [
    (3, None, "cannot hold equally"),
    (2, [8, 8, 8], "routing must give 4 counts"),
    (2, [8, 8, 8, 9], "summing to 32"),
    (2, [-1, 9, 12, 12], "counts >= 0"),
], ids=["ep-not-dividing-experts", "too-few-counts", "wrong-sum", "negative"])
def test_expert_parallelism_that_cannot_be_laid_out_is_an_input_error(hand, ep, routing,
                                                                      message):
    model, args = hand
    with pytest.raises(InputError, match=message):
        analyze_experts(model, args, ep=ep, routing=routing)


def test_a_model_without_experts_is_an_input_error_naming_the_option():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(InputError, match="experts="):
        analyze_experts(model, (torch.randn(2, 4),), ep=2, top_k=1, num_experts=2, hidden=4)


def test_tiny_mixtral_experts_per_rank_and_all_to_alls_by_hand():
    from transformers import MixtralConfig, MixtralForCausalLM

    hidden, ffn, experts, top_k, tokens = 16, 32, 4, 2, 2 * 8
    config = MixtralConfig(vocab_size=64, hidden_size=hidden, intermediate_size=ffn,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           num_local_experts=experts, num_experts_per_tok=top_k,
                           max_position_embeddings=64)
    with torch.device("meta"):
        model = MixtralForCausalLM(config).eval()
    args = (torch.zeros(2, 8, dtype=torch.int64, device="meta"),)
    single = analyze(model, args).total
    result = analyze_experts(model, args, ep=2)
    # A copy through a Mixtral expert: gate and up (H x 2F, one grouped matmul), down (F x H).
    per_copy = hidden * 2 * ffn + ffn * hidden  # 1536
    for rank in result.ranks:
        # 2 ranks x 16 tokens x 2 copies over 2 ranks: 32 copies per layer, 2 layers.
        assert rank.expert.macs == 2 * 32 * per_copy  # 98304
        assert all(c.bytes == tokens * top_k * hidden * 4 for c in rank.all_to_alls)  # 2048
        assert len(rank.all_to_alls) == 2 * 2
        assert _all_costs_equal(rank.total, single)
    # Every copy to rank 1's experts: it runs both batches' 64 copies per layer, rank 0 none.
    skewed = analyze_experts(model, args, ep=2, routing=[0, 0, 40, 24])
    assert skewed.busiest_rank == 1
    assert skewed.ranks[1].expert.macs == 2 * 64 * per_copy  # 196608
    assert skewed.ranks[0].expert.macs == 0


def test_a_qwen2_moe_shared_expert_is_work_every_rank_does_on_its_own_batch():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    hidden, ffn, shared = 16, 8, 24
    config = Qwen2MoeConfig(vocab_size=64, hidden_size=hidden, intermediate_size=32,
                            moe_intermediate_size=ffn, shared_expert_intermediate_size=shared,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            num_experts=4, num_experts_per_tok=2)
    with torch.device("meta"):
        model = Qwen2MoeForCausalLM(config).eval()
    result = analyze_experts(model, (torch.zeros(2, 8, dtype=torch.int64, device="meta"),),
                             ep=2)
    # Only the routed experts are sharded; the shared expert (and its gate) stays in the rest.
    assert result.layers == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert (result.num_experts, result.top_k, result.tokens) == (4, 2, 16)
    # 32 copies per layer per rank (balanced), each through gate/up (H x 2F) and down (F x H).
    for rank in result.ranks:
        assert rank.expert.macs == 2 * 32 * (hidden * 2 * ffn + ffn * hidden)  # 24576
        # Per layer, the shared expert's 3 projections and its 1-wide gate on 16 tokens.
        shared_macs = 2 * 16 * (3 * hidden * shared + hidden * 1)  # 37376
        assert rank.rest.macs >= shared_macs


def test_the_record_round_trips_through_json_and_its_view_names_the_busiest_rank(hand):
    model, args = hand
    result = analyze_experts(model, args, ep=2, routing=[4, 4, 20, 4])
    assert ExpertParallelReport.model_validate_json(result.model_dump_json()) == result
    text = experts_view(result, rank=1, link_bytes_per_s=100e9)
    assert "Rank 1 is the busiest" in text
    assert text.count("token_dispatch") == 2 and "time" in text
    balanced = experts_view(analyze_experts(model, args, ep=2))
    assert "busiest" not in balanced and "Every rank computes" in balanced


def test_a_factory_models_record_and_the_commands_view_of_it(models_file, capsys):
    from exportflops.parallel import Layout, analyze_ranks

    # on meta, as the command builds `file.py:build` for --ep 2 (2 data-parallel ranks)
    model, args = loaded_models(models_file).build(torch.device("meta"))
    record = analyze_ranks(model, args, layout=Layout(dp=2, ep=2))
    assert record.ranks[1].expert.macs == 2 * 16 * MACS_PER_COPY
    skewed = analyze_ranks(model, args, layout=Layout(dp=2, ep=2), routing=[4, 4, 20, 4])
    assert skewed.busiest_rank == 1
    assert skewed.ranks[1].expert.macs == 2 * 24 * MACS_PER_COPY
    spec = f"{models_file}:build"
    assert main([spec, "--ep", "2", "--rank", "1", "--routing", "4,4,20,4"]) == 0
    assert "All-to-alls of rank 1 of 2" in capsys.readouterr().out


def test_a_two_layer_mixtral_on_two_expert_ranks():
    from exportflops import hf
    from exportflops.parallel import Layout, analyze_ranks

    # as `exportflops hf:mixtral --layers 2 --ep 2` counts it: the single-device count by the
    # hf: policy (decided on cpu where meta cannot)
    record = analyze_ranks(*hf.build("mixtral", layers=2), layout=Layout(dp=2, ep=2),
                           single_device=hf.analyze("mixtral", layers=2))
    record = json.loads(record.model_dump_json())
    # Mixtral-8x7B's sizes: H 4096, F 14336, 8 experts, top 2; hf: builds a (1, 128) batch.
    per_copy = 4096 * 2 * 14336 + 14336 * 4096
    assert record["ranks"][1]["routed_tokens"] == 128 * 2
    assert record["ranks"][1]["expert"]["macs"] == 2 * 256 * per_copy
    assert record["ranks"][1]["all_to_alls"][0]["bytes"] == 128 * 2 * 4096 * 4


@pytest.mark.parametrize("flags, message", [
    (["--ep", "2", "--rank", "2"], "--rank one of 0..1"),
    (["--routing", "4,4,20,4"], "pass --ep"),
    (["--ep", "2", "--tp", "2"], "has no tensor-parallel plan"),
    (["--ep", "2", "--routing", "4,x"], "counts >= 0"),
    (["--ep", "2", "--format", "csv"], "as a table, Markdown or JSON"),
    (["--ep", "3"], "cannot hold equally"),
    (["--ep", "2", "--routing", "4,4"], "routing must give 4 counts"),
], ids=["rank-out-of-range", "routing-without-ep", "with-tp", "bad-routing", "csv",
        "ep-not-dividing", "short-routing"])
def test_bad_expert_parallel_flags_are_usage_errors(models_file, capsys, flags, message):
    assert main([f"{models_file}:build", *flags]) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip() and message in stderr, stderr
