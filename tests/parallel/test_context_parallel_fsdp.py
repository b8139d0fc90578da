"""Context parallelism inside FSDP2 (torchtitan's cp inside fsdp, `analyze_context(fsdp=)`,
``--cp C --fsdp F``): F rings of C consecutive ranks (cp innermost in torchtitan's mesh), each
rank doing the work and ring traffic of its place on its ring, plus FSDP2's all-gathers and
reduce-scatters of every parameter over all F x C ranks, traced from real FSDP2 on a fake copy;
checked on test_context_parallel's model and a two-block variant against sizes derived here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.parallel.context import analyze_context
from exportflops.records.context import ContextParallelReport
from exportflops.render.context import context_view
from tests.cli_support import one_paragraph
from tests.parallel.test_context_parallel import DIM, F32, HEAD_DIM, HEADS, CausalAttention, ids

CP, FSDP = 2, 2
WORLD = FSDP * CP  # 4: FSDP2 shards over dp_shard x cp
#: CausalAttention's parameters, all in its root unit (no blocks): the embedding 32 x 8 and
#: the q/k/v linear 24 x 8 (both dim 0s, 32 and 24, split 4 ways unpadded).
ROOT_PARAMS = 32 * DIM + 3 * DIM * DIM  # 256 + 192 = 448
REPO = Path(__file__).resolve().parents[2]


class Block(nn.Module):
    """CausalAttention's linear and causal attention as a block, its output (B, L, DIM)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        qkv = self.qkv(x).view(B, L, 3, HEADS, HEAD_DIM)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, H, L, hd)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(
            B, L, DIM)


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, DIM)
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def train() -> ContextParallelReport:
    return analyze_context(CausalAttention(), (ids(),), cp=CP, fsdp=FSDP, mode="train")


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["round-robin", "contiguous"])
def test_each_rank_does_the_work_and_ring_traffic_of_its_place_on_its_ring(mode, load_balance):
    """FSDP2 moves parameters, not FLOPs: global rank r is rank r mod cp of the ring of ranks
    cp x (r div cp) .. + cp - 1, with that ring rank's positions, FLOPs and sends."""
    alone = analyze_context(CausalAttention(), (ids(),), cp=CP, mode=mode,
                            load_balance=load_balance)
    inside = analyze_context(CausalAttention(), (ids(),), cp=CP, fsdp=FSDP, mode=mode,
                             load_balance=load_balance)
    assert [r.rank for r in inside.ranks] == list(range(WORLD))
    for rank in inside.ranks:
        same = alone.ranks[rank.rank % CP]
        assert rank.cp_rank == same.rank
        assert rank.chunks == same.chunks and rank.attention_pairs == same.attention_pairs
        assert (rank.flops, rank.attention_macs, rank.other_macs, rank.backward_flops) == (
            same.flops, same.attention_macs, same.other_macs, same.backward_flops)
        assert [(s.phase, s.tensors, s.sends, s.bytes) for s in rank.sends] == [
            (s.phase, s.tensors, s.sends, s.bytes) for s in same.sends]
    assert inside.busiest.rank == alone.busiest.rank
    assert inside.imbalance == alone.imbalance


def test_rings_are_consecutive_ranks_and_send_within_themselves(train):
    # torchtitan's ("pp", "batch", "cp", "tp") mesh, cp innermost: rings {0, 1} and {2, 3}.
    assert train.cp_group(0) == [0, 1] and train.cp_group(3) == [2, 3]
    assert train.world_size() == WORLD
    for rank in train.ranks:
        ring = train.cp_group(rank.rank)
        other = ring[1 - rank.cp_rank]  # two ranks on a ring: next and previous are the other
        assert {(s.to_rank, s.from_rank) for s in rank.sends} == {(other, other)}


def test_fsdp_gathers_every_parameter_over_the_4_ranks_and_reduce_scatters_its_gradient(train):
    """No blocks: the root is FSDP2's one unit. Forward: one all-gather of its 448 float32s.
    Backward: torch keeps the root unsharded after the forward (_fsdp_state.py: "For the root,
    do not reshard after forward"), so no second gather, and one reduce-scatter of its
    gradients, the same 448 float32s."""
    assert [(c.module, c.op, c.phase, c.mesh_dim, c.group_size, c.bytes)
            for c in train.fsdp_collectives] == [
        ("", "all_gather", "forward", "fsdp", 4, ROOT_PARAMS * F32),        # 1792
        ("", "reduce_scatter", "backward", "fsdp", 4, ROOT_PARAMS * F32)]
    assert {c.bandwidth_factor for c in train.fsdp_collectives} == {3 / 4}  # (n - 1) / n


def test_blocks_are_gathered_again_in_the_backward():
    """Two blocks of a q/k/v linear 24 x 8 (192 float32s, 768 bytes) and a root holding the
    32 x 8 embedding (256 float32s, 1024 bytes): forward gathers the root, then each block;
    blocks reshard after the forward (FSDP2's default), so the backward gathers each again, in
    reverse, and reduce-scatters each unit's gradients."""
    block, root = 3 * DIM * DIM * F32, 32 * DIM * F32  # 768, 1024
    record = analyze_context(TwoBlocks(), (ids(),), cp=CP, fsdp=FSDP, mode="train")
    forward = [(c.module, c.op, c.bytes) for c in record.fsdp_collectives
               if c.phase == "forward"]
    assert forward == [("", "all_gather", root), ("layers.0", "all_gather", block),
                       ("layers.1", "all_gather", block)]
    backward = sorted((c.module, c.op, c.bytes) for c in record.fsdp_collectives
                      if c.phase == "backward")
    assert backward == [("", "reduce_scatter", root),
                        ("layers.0", "all_gather", block), ("layers.0", "reduce_scatter", block),
                        ("layers.1", "all_gather", block), ("layers.1", "reduce_scatter", block)]
    assert {c.group_size for c in record.fsdp_collectives} == {WORLD}
    # Per rank over the step: root 2 x 1024, each block 3 x 768.
    assert sum(c.bytes for c in record.fsdp_collectives) == 2 * root + 2 * 3 * block  # 6656


def test_a_rank_lists_fsdps_collectives_and_its_ring_sends_forward_first(train):
    listed = train.collectives(3)
    # FSDP2's 2, and the ring's: forward 1 send, backward 1 key/value + 2 gradient sends.
    assert len(listed) == 2 + 1 + 1 + 2
    phases = [c.phase for c in listed]
    assert phases == sorted(phases, key=lambda phase: phase == "backward")
    assert {c.mesh_dim for c in listed} == {"fsdp", "cp"}


def test_the_record_round_trips_and_its_view_names_rings_and_fsdp_collectives(train):
    assert ContextParallelReport.model_validate_json(train.model_dump_json()) == train
    text = context_view(train, rank=3)
    assert "inside 4 FSDP2 ranks (2 rings of 2 consecutive ranks" in text
    assert "Ring traffic of rank 3 (#1 of ring 2-3) (to rank 2, from rank 2)" in text
    assert "FSDP2 collectives of rank 3" in text and text.count("reduce_scatter") == 1
    assert "2-3 (#1)" in text


def test_a_record_written_before_fsdp_composed_still_loads():
    alone = analyze_context(CausalAttention(), (ids(),), cp=CP).model_dump(mode="json")
    for key in ("fsdp", "fsdp_collectives"):
        del alone[key]
    for rank in alone["ranks"]:
        del rank["cp_rank"]  # the layout before FSDP2 composed: ranks 0 .. cp - 1 only
    read = ContextParallelReport.model_validate(alone)
    assert [r.cp_rank for r in read.ranks] == [r.rank for r in read.ranks] == list(range(CP))
    assert read.fsdp is None and read.fsdp_collectives == [] and read.world_size() == CP


@pytest.mark.parametrize("fsdp", [0, True, 1.5], ids=["zero", "bool", "float"])
def test_an_fsdp_degree_that_is_not_an_int_of_at_least_1_is_refused(fsdp):
    with pytest.raises(InputError, match="fsdp"):
        analyze_context(CausalAttention(), (ids(),), cp=CP, fsdp=fsdp)


# --- the command ---------------------------------------------------------------------------------

MODELS = """
from tests.parallel.test_context_parallel import CausalAttention, ids


def build(device):
    return CausalAttention().to(device), (ids().to(device),)
"""


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cp_fsdp") / "cp_models.py"
    path.write_text(MODELS)
    return path


def test_every_rank_of_fsdp_x_cp_is_reported():
    from exportflops.parallel import Layout, analyze_ranks

    # on meta, as the command builds MODELS' build for --cp 2 --fsdp 2
    record = analyze_ranks(CausalAttention().to("meta"), (ids().to("meta"),),
                           layout=Layout(fsdp=2, cp=2))
    assert (record.cp, record.fsdp, len(record.ranks)) == (2, 2, 4)
    assert [r.cp_rank for r in record.ranks] == [0, 1, 0, 1]
    assert [c.bytes for c in record.fsdp_collectives] == [ROOT_PARAMS * F32]  # forward


def test_a_ranks_report_carries_the_ranks_collectives():
    from exportflops.parallel import Layout, analyze_ranks

    model, args, layout = CausalAttention(), (ids(),), Layout(fsdp=2, cp=2)
    record = analyze_ranks(model, args, layout=layout)
    report = analyze_ranks(model, args, layout=layout, rank=3)
    assert (report.world_size, report.rank) == (4, 3)
    assert report.collectives == record.collectives(3)
    assert sorted(c.op for c in report.collectives) == ["all_gather", "send"]


def test_python_m_exportflops_runs_cp_inside_fsdp(models_file):
    done = subprocess.run([sys.executable, "-m", "exportflops", f"{models_file}:build", "--cp",
                           "2", "--fsdp", "2", "--rank", "3", "--mode", "train"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "FSDP2 collectives of rank 3" in done.stdout
    assert "Ring traffic of rank 3 (#1 of ring 2-3)" in done.stdout


@pytest.mark.parametrize("flags, message", [
    (["--cp", "2", "--fsdp", "2", "--rank", "4"], "--rank one of 0..3 (the fsdp x cp ranks)"),
    (["--cp", "2", "--fsdp", "0"], "--fsdp 0 --cp 2: Layout: fsdp is a degree, an int >= 1"),
    (["--cp", "2", "--fsdp", "2", "--tp", "2", "--rank", "8"],
     "--rank one of 0..7 (the fsdp x cp x tp ranks)"),
], ids=["rank-past-fsdp-x-cp", "fsdp-zero", "rank-past-fsdp-x-cp-x-tp"])
def test_bad_cp_inside_fsdp_flags_are_usage_errors(models_file, capsys, flags, message):
    assert main([f"{models_file}:build", *flags]) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip() and message in stderr, stderr
