"""Context parallelism with tensor parallelism (``--cp C --tp T [--fsdp F]``, torchtitan's mesh
(fsdp, cp, tp), tp innermost): each rank runs its tensor-parallel rank on its ring's share of the
sequence; every number derived by hand below.

The model: test_context_parallel's, its attention split by a plan: token ids -> embedding (8
channels, replicated) -> q, k, v linears 8 -> 8 (column-parallel: each of tp = 2 ranks computes
4 channels, one head of 4) -> causal ``scaled_dot_product_attention`` -> o linear 8 -> 8
(row-parallel: 4 channels in, a partial sum all-reduced). Per rank and token: q, k, v 3 x 8 x 4
and o 4 x 8, 128 MACs, 256 FLOPs. Per (query, key) pair: one head, half of test_context_parallel's
two: 8 MACs and 23 FLOPs. T = 16, cp = 2: each ring place holds 8 positions, rank places 0 and 1
attend to 68 causal pairs each (test_context_parallel's derivation).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from exportflops.cli import main
from exportflops.parallel import Layout, analyze_ranks
from exportflops.parallel.context.ranks import analyze_context_ranks, context_rank_report
from exportflops.records.context import ContextParallelReport
from exportflops.render.context import context_view
from tests.cli_support import one_paragraph
from tests.parallel.test_context_parallel import DIM, F32, HEAD_DIM, PAIR_FLOPS, PAIR_MACS, T

CP, TP = 2, 2
LOCAL = T // CP  # 8 positions per ring place
RANK_MACS_PER_TOKEN = 3 * DIM * (DIM // TP) + (DIM // TP) * DIM  # 96 + 32 = 128
KV_SEND = 2 * LOCAL * HEAD_DIM * F32  # one head's key and value: 256 bytes


class SplitAttention(nn.Module):
    """test_context_parallel's CausalAttention with separate q, k, v and an output linear, and
    the tensor-parallel plan torchtitan gives attention."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        self.embed = nn.Embedding(32, DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.tp_plan = {"q": ColwiseParallel(), "k": ColwiseParallel(),
                        "v": ColwiseParallel(), "o": RowwiseParallel()}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, L = ids.shape
        x = self.embed(ids)
        q, k, v = (p(x).view(B, L, -1, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k,
                                                                           self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, local heads, L, hd)
        return self.o(y.transpose(1, 2).reshape(B, L, -1))


class MaskedOncePerStep(SplitAttention):
    """SplitAttention with its causal mask built from positions, once per step: a term in
    seq**2 without the batch, which is no (query, key) pair of a row."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, L = ids.shape
        pos = torch.arange(L, device=ids.device)
        mask = pos[:, None] >= pos[None, :]
        x = self.embed(ids)
        q, k, v = (p(x).view(B, L, -1, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k,
                                                                           self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(B, L, -1))


class Scaled(nn.Module):
    """An embedding scaled by a tensor held as a plain attribute, not a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, DIM)
        self.scale = torch.full((DIM,), 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.scale


MODELS = """
import torch
from tests.parallel.test_context_parallel_tp import MaskedOncePerStep, SplitAttention


def ids(device):
    return torch.zeros(1, 16, dtype=torch.long, device=device)


def build(device):
    return SplitAttention().to(device), (ids(device),)


def masked(device):
    return MaskedOncePerStep().to(device), (ids(device),)
"""


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cp_tp") / "cp_tp_models.py"
    path.write_text(MODELS)
    return path


def _split(*, rank: int = 0, mode: str = "forward", **degrees: int):
    """(rank ``rank``'s report, the record of every rank) of SplitAttention on
    ``Layout(**degrees)``: the library calls the command's ``--cp 2 --tp 2`` makes."""
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    record, fpb = analyze_context_ranks(SplitAttention().to("meta"), (ids,),
                                        layout=Layout(**degrees), mode=mode, rank=rank)
    return context_rank_report(record, fpb, rank), record


@pytest.fixture(scope="module")
def forward():
    return _split(cp=CP, tp=TP, rank=3)


def test_each_rank_does_its_heads_attention_on_its_places_pairs_and_its_linears_shards(forward):
    _, record = forward
    assert (record.cp, record.tp, record.world_size()) == (CP, TP, 4)
    assert [r.cp_rank for r in record.ranks] == [0, 0, 1, 1]  # tp innermost
    assert [r.attention_pairs for r in record.ranks] == [68] * 4
    assert (record.macs_per_pair, record.flops_per_pair) == (PAIR_MACS // 2, PAIR_FLOPS // 2)
    assert [r.attention_macs for r in record.ranks] == [68 * 8] * 4
    assert [r.attention_flops for r in record.ranks] == [68 * 23] * 4
    assert [r.other_macs for r in record.ranks] == [LOCAL * RANK_MACS_PER_TOKEN] * 4  # 1024
    assert [r.other_flops for r in record.ranks] == [2 * LOCAL * RANK_MACS_PER_TOKEN] * 4


def test_each_rank_sends_its_heads_keys_and_values_to_its_rings_next_rank(forward):
    _, record = forward
    assert [(s.bytes, s.sends) for s in record.ranks[0].sends] == [(KV_SEND, 1)]
    # Rings are ranks tp apart: {0, 2} and {1, 3}.
    assert [(r.sends[0].to_rank, r.sends[0].from_rank) for r in record.ranks] == [
        (2, 2), (3, 3), (0, 0), (1, 1)]
    assert record.cp_group(3) == [1, 3]


def test_the_row_parallel_output_all_reduces_the_places_tokens(forward):
    report, record = forward
    assert [(c.op, c.phase, c.bytes, c.group_size) for c in record.tp_collectives] == [
        ("all_reduce", "forward", LOCAL * DIM * F32, TP)]  # (1, 8, 8) float32: 256 bytes
    assert (report.world_size, report.rank) == (4, 3)
    assert sorted(c.op for c in report.collectives) == ["all_reduce", "send"]


def test_the_view_names_the_mesh_rings_and_tensor_parallel_collectives(forward):
    _, record = forward
    text = context_view(record, rank=3)
    assert "2 tensor-parallel ranks at each place of a ring (4 ranks)" in text
    assert "Ring traffic of rank 3 (#1 of ring 1, 3) (to rank 1, from rank 1)" in text
    assert "Tensor-parallel collectives of rank 3 (its group 2-3)" in text
    assert ContextParallelReport.model_validate_json(record.model_dump_json()) == record


def test_in_training_each_rank_pays_its_heads_backward_too():
    _, record = _split(cp=CP, tp=TP, mode="train")
    # test_context_parallel: backward per pair and head, dq, dk, dv and dp, 2 x 8 MACs; with
    # the forward's 8, 24 on the rank's one head.
    assert record.macs_per_pair == 8 + 2 * 8
    assert [r.attention_macs for r in record.ranks] == [68 * 24] * 4
    # Each linear's backward: its input's and its weight's gradients, 2 x its forward MACs.
    assert [r.other_macs for r in record.ranks] == [3 * LOCAL * RANK_MACS_PER_TOKEN] * 4
    assert all(0 < r.backward_flops < r.flops for r in record.ranks)
    assert [(s.tensors, s.sends, s.bytes) for s in record.ranks[0].sends] == [
        ("key/value", 1, KV_SEND), ("key/value", 1, KV_SEND),
        ("key/value gradients", 2, 2 * LOCAL * HEAD_DIM * F32)]


def test_inside_fsdp_every_rank_gathers_its_tensor_parallel_shards_over_fsdp_x_cp():
    _, record = _split(cp=CP, tp=TP, fsdp=2, rank=7)
    assert (record.fsdp, record.world_size(), len(record.ranks)) == (2, 8, 8)
    assert [r.cp_rank for r in record.ranks] == [0, 0, 1, 1, 0, 0, 1, 1]
    # The root unit: the replicated embedding 32 x 8 and the four linears' 8 x 4 shards.
    gathered = (32 * DIM + 4 * DIM * (DIM // TP)) * F32  # 1536 bytes
    assert [(c.op, c.bytes, c.group_size) for c in record.fsdp_collectives] == [
        ("all_gather", gathered, FSDP_X_CP)]
    assert record.cp_group(7) == [5, 7]


FSDP_X_CP = 4


def test_the_command_prints_json_of_every_rank_as_analyze_ranks_returns_it(models_file,
                                                                           capsys):
    assert main([f"{models_file}:build", "--cp", "2", "--tp", "2", "--format", "json"]) == 0
    record = ContextParallelReport.model_validate_json(capsys.readouterr().out)
    assert (record.cp, record.tp, len(record.ranks)) == (2, 2, 4)
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    library = analyze_ranks(SplitAttention().to("meta"), (ids,), layout=Layout(cp=CP, tp=TP))
    assert (library.ranks, library.tp_collectives) == (record.ranks, record.tp_collectives)


@pytest.mark.parametrize("flags, message", [
    (["--cp", "2", "--tp", "2", "--rank", "4"], "--rank one of 0..3 (the cp x tp ranks)"),
    (["--cp", "2", "--tp", "0"], "--cp 2 --tp 0: Layout: tp is a degree, an int >= 1"),
    (["--cp", "2", "--tp", "4"], "must exceed 3 x tp"),  # 8 positions, read at 8 - 3 x 4 < 0
    (["--cp", "2", "--tp", "2", "--ep", "2"], "not with"),
], ids=["rank-past-cp-x-tp", "tp-zero", "too-short-to-read", "with-ep"])
def test_bad_cp_with_tp_flags_are_usage_errors(models_file, capsys, flags, message):
    assert main([f"{models_file}:build", *flags]) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip() and message in stderr, stderr


def test_a_term_in_seq_squared_without_the_batch_is_refused_with_tp(models_file, capsys):
    assert main([f"{models_file}:masked", "--cp", "2", "--tp", "2"]) == 2
    stderr = capsys.readouterr().err
    assert "analyze --cp without --tp" in stderr and one_paragraph(stderr), stderr
    assert main([f"{models_file}:masked", "--cp", "2"]) == 0  # without --tp it splits


@pytest.mark.parametrize("model, mul_inputs", [
    # moves itself with .to(device): torch cannot swap a fake parameter
    (lambda device: SplitAttention().to(device), None),
    # a plain tensor attribute goes onto fake tensors too
    (lambda device: Scaled(), ([1, 16, DIM], [DIM])),
], ids=["build", "scaled"])
def test_fsdp_counts_models_built_on_meta_then_copied_onto_fake_tensors(model, mul_inputs):
    def build(device):  # as the command calls a factory taking the device, for each rank
        return model(device), (torch.zeros(1, 16, dtype=torch.long, device=device),), None

    report = analyze_ranks(build, layout=Layout(fsdp=2), rank=0)
    assert report.world_size == 2
    if mul_inputs:
        mul = next(n for n in report.nodes if n.op == "aten.mul.Tensor")
        assert [list(i.shape) for i in mul.inputs] == list(mul_inputs)
        assert mul.cost.flops == 128  # 16 tokens x 8 channels, one multiply each
