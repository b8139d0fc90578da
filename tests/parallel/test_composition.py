"""Pipeline parallelism composed with tensor parallelism and FSDP (issue 38, item 4): each stage
counted once, as one rank of its (fsdp, tp) group, on the mesh (pp, fsdp, tp) with tp innermost.

Expected numbers are derived here from the configs: a Linear on N tokens is 2 * N * in * out
FLOPs (one multiply-accumulate = 2 FLOPs), and the Llama plan (`exportflops.examples.parallel`,
torchtitan's) splits wq/wk/wv/w1/w3/output by columns and wo/w2 by rows, so each of them does
1/tp of its single-device matmul on a rank.
"""

from __future__ import annotations

import pytest

from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.parallel.pipeline.ranks import stage_rank_counter
from exportflops.examples.llama import LLAMA3_8B, LlamaConfig, llama
from exportflops.parallel.pipeline import analyze_pipeline
from exportflops.parallel.pipeline.analysis import count_pipeline
from exportflops.parallel import Layout
from exportflops.parallel.pipeline.mesh import rank_report
from exportflops.records.pipeline import PipelineReport

F32 = 4  # bytes per float32 element
SMALL = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                    ffn_dim=128, max_seq_len=64)
BATCH, SEQ = 2, 16
TOKENS = BATCH * SEQ
TP = 2


def _build(device):
    return llama(device, SMALL, seq_len=SEQ, batch=BATCH)


@pytest.fixture(scope="module")
def composed():
    """The small Llama in 2 stages, each counted as one rank of tp 2 (forward)."""
    model, args = _build("meta")
    count = stage_rank_counter(_build, SMALL.n_layers, 2, tp=TP, fsdp=None,
                               mode="forward", strict=True)
    single = analyze_pipeline(model, args, stages=2, mode="forward", device=None, strict=True)
    split = count_pipeline(model, args, stages=2, mode="forward", device=None, strict=True,
                           count_stage=count, tp=TP)
    return single, split


def _module_flops(report, path: str) -> int:
    return next(m for m in report.modules if m.path == path).inclusive.flops


@pytest.mark.parametrize(("stage", "path", "single_device_flops"), [
    # column-parallel: out features split; 4 heads x 16 = 64 query columns, 2 x 16 key columns
    (0, "layers.0.attention.wq", 2 * TOKENS * 64 * (4 * 16)),
    (0, "layers.1.attention.wk", 2 * TOKENS * 64 * (2 * 16)),
    (0, "layers.1.attention.wv", 2 * TOKENS * 64 * (2 * 16)),
    (1, "layers.2.feed_forward.w1", 2 * TOKENS * 64 * 128),
    (1, "layers.3.feed_forward.w3", 2 * TOKENS * 64 * 128),
    (1, "output", 2 * TOKENS * 64 * 256),
    # row-parallel: in features split (the partial sums are all-reduced, not multiplied)
    (0, "layers.0.attention.wo", 2 * TOKENS * (4 * 16) * 64),
    (1, "layers.3.feed_forward.w2", 2 * TOKENS * 128 * 64),
], ids=["wq", "wk", "wv", "w1", "w3", "output", "wo", "w2"])
def test_a_stage_rank_does_1_over_tp_of_each_split_matmul(composed, stage, path,
                                                          single_device_flops):
    single, split = composed
    assert _module_flops(single.stage_reports[stage], path) == single_device_flops
    assert _module_flops(split.stage_reports[stage], path) == single_device_flops // TP


def test_a_stage_rank_attends_with_1_over_tp_of_the_heads(composed):
    _, split = composed
    for stage, layer in ((0, 0), (1, 3)):
        report = split.stage_reports[stage]
        # A rank's attention (its DTensor graph lowers SDPA to the math path) multiplies
        # q k^T and then the weights by v, each a batch of B x (heads / tp) matrices, (T, hd) x
        # (hd, T) and (T, T) x (T, hd): 2 * B * (4 / 2) * T * T * hd FLOPs each.
        matmuls = [n.cost.flops for n in report.nodes if n.op == "aten.bmm.default"
                   and n.module == f"layers.{layer}.attention"]
        assert matmuls == [2 * BATCH * (4 // TP) * SEQ * SEQ * 16] * 2


def test_each_stage_is_analyzed_once_for_the_ranks_of_its_tp_group(composed):
    _, split = composed
    record = split.record
    assert (record.pp, record.tp, record.fsdp, record.world_size()) == (2, 2, 1, 4)
    # mesh (pp 2, tp 2), tp innermost: stage 0 on global ranks 0 and 1, stage 1 on 2 and 3
    assert [s.stands_for for s in record.stages] == [[0, 1], [2, 3]]
    assert len(split.stage_reports) == 2  # two analyses stand for four ranks
    # each stage rank of the plan all-reduces wo's and w2's partial sums: 2 per layer, 2
    # layers per stage, each the (B, T, dim) hidden state in float32; stage 0 first the
    # row-split embedding's (each rank looks up its half of the vocabulary); the last stage
    # gathers the output's column shards of the logits, (B, T, vocab / tp) from each rank.
    hidden = BATCH * SEQ * 64 * F32
    first, last = record.stages
    for stage, reduces in ((first, 1 + 2 * 2), (last, 2 * 2)):
        all_reduces = [c for c in stage.collectives if c.op == "all_reduce"]
        assert [c.bytes for c in all_reduces] == [hidden] * reduces
        assert all(c.group_size == TP and c.mesh_dim == "tp" for c in all_reduces)
    gathers = [c for c in last.collectives if c.op == "all_gather"]
    assert len(gathers) == 1 and gathers[0].group_size == TP
    assert first.collectives[0].op == "all_reduce" and not any(
        c.op == "all_gather" for c in first.collectives)


def test_a_ranks_report_sends_to_the_rank_of_its_own_tp_index(composed):
    _, split = composed
    report = rank_report(split, 3)  # pipeline rank 1, tp index 1
    assert (report.world_size, report.rank) == (4, 3)
    receives = [c for c in report.collectives if c.op == "recv"]
    # stage 1 receives the hidden state and two rotary tables from stage 0's tp index 1: rank 1
    assert len(receives) == 3 and {c.peer for c in receives} == {1}
    assert sum(c.bytes for c in receives) == (BATCH * SEQ * 64 + 2 * SEQ * 16) * F32
    assert any(c.op == "all_reduce" for c in report.collectives)
    # rank 1 (stage 0, tp index 1) sends to stage 1's rank of tp index 1: 1 * 2 + 1 = 3
    sends = [c for c in rank_report(split, 1).collectives if c.op == "send"]
    assert len(sends) == 3 and {c.peer for c in sends} == {3}
    # the representatives (tp index 0) send and receive between ranks 0 and 2
    assert {c.peer for c in split.stage_reports[0].collectives if c.op == "send"} == {2}
    assert {c.peer for c in split.stage_reports[1].collectives if c.op == "recv"} == {0}


@pytest.mark.parametrize(("rank", "fsdp", "tp", "coordinates"), [
    (0, 2, 2, (0, 0, 0)),
    (5, 2, 2, (1, 0, 1)),   # 5 = (1 * 2 + 0) * 2 + 1
    (6, 2, 2, (1, 1, 0)),   # 6 = (1 * 2 + 1) * 2 + 0
    (15, 2, 2, (3, 1, 1)),  # the last of pp 4 x fsdp 2 x tp 2
    (3, 1, 2, (1, 0, 1)),   # pp x tp: 3 = 1 * 2 + 1
    (3, 2, 1, (1, 1, 0)),   # pp x fsdp: 3 = 1 * 2 + 1
], ids=["first", "pp1-tp1", "pp1-fsdp1", "last", "pp-x-tp", "pp-x-fsdp"])
def test_a_global_rank_maps_to_its_pipeline_fsdp_and_tp_index(rank, fsdp, tp, coordinates):
    at = Layout(pp=4, fsdp=fsdp, tp=tp).coordinates(rank)
    assert (at["pp"], at["fsdp"], at["tp"]) == coordinates


# Llama 3 8B (the command's llama), one rank's parameters of the last of 2 stages (layers
# 16-31, the final norm, the output): per layer the projections, the SwiGLU and two norms.
DIM, KV, FFN, VOCAB = LLAMA3_8B.dim, LLAMA3_8B.n_kv_heads * LLAMA3_8B.head_dim, \
    LLAMA3_8B.ffn_dim, LLAMA3_8B.vocab_size
LAYER_LINEARS = 2 * DIM * DIM + 2 * DIM * KV + 3 * DIM * FFN  # wq, wo; wk, wv; w1, w2, w3


def _command(flags: list[str], capsys) -> PipelineReport:
    argv = ["llama", "--pp", "2", "--tp", "2", "--rank", "3", "--microbatches", "4",
            "--format", "json", *flags]
    assert main(argv) == 0
    return PipelineReport.model_validate_json(capsys.readouterr().out)


def _check_sends_and_tp_reduces(record: PipelineReport) -> None:
    first, last = record.stages
    # the hidden state (1, 8192, 4096) and two rotary tables (8192, 128) go to stage 1 whole:
    # the plan's blocks end replicated
    assert sum(c.bytes for c in first.sends) == (8192 * DIM + 2 * 8192 * 128) * F32
    # 2 all-reduces per layer (wo, w2) of the (1, 8192, 4096) float32 hidden state, 16 layers
    reduces = [c for c in last.collectives if c.op == "all_reduce"]
    assert [c.bytes for c in reduces] == [8192 * DIM * F32] * (2 * 16)
    assert all(c.mesh_dim == "tp" and c.group_size == 2 for c in reduces)


def test_the_command_lays_out_pp_by_tp(capsys):
    record = _command([], capsys)
    assert (record.pp, record.tp, record.fsdp, record.world_size()) == (2, 2, 1, 4)
    first, last = record.stages
    assert (first.stands_for, last.stands_for) == ([0, 1], [2, 3])
    # tp 2 splits every linear and the output in two; the norms stay whole on each rank
    assert last.params == 16 * (LAYER_LINEARS // 2 + 2 * DIM) + DIM + VOCAB * DIM // 2
    _check_sends_and_tp_reduces(record)


def test_the_command_lays_out_pp_by_fsdp_by_tp(capsys):
    record = _command(["--fsdp", "2"], capsys)
    assert (record.pp, record.tp, record.fsdp, record.world_size()) == (2, 2, 2, 8)
    first, last = record.stages
    # mesh (pp 2, fsdp 2, tp 2), tp innermost: stage 1 on ranks 4..7 (rank 3 is stage 0's)
    assert (first.stands_for, last.stands_for) == ([0, 1, 2, 3], [4, 5, 6, 7])
    _check_sends_and_tp_reduces(record)
    # FSDP2 gathers each block's parameters before its forward: the layer's tp shard (half
    # of each linear, the two norms whole) from the 2 fsdp ranks, float32.
    gathers = {c.module: c for c in last.collectives
               if c.op == "all_gather" and c.phase == "forward" and c.module.startswith("l")}
    assert sorted(gathers) == sorted(f"layers.{i}" for i in range(16, 32))
    assert {c.bytes for c in gathers.values()} == {(LAYER_LINEARS // 2 + 2 * DIM) * F32}
    assert {(c.mesh_dim, c.group_size) for c in gathers.values()} == {("fsdp", 2)}


def test_in_training_pp_by_fsdp_gathers_each_block_once_and_scatters_its_gradients(capsys):
    last = _command(["--fsdp", "2", "--mode", "train"], capsys).stages[1]
    fsdp = [c for c in last.collectives if c.mesh_dim == "fsdp"]
    # torchtitan keeps the parameters gathered under pipeline parallelism
    # (reshard_after_forward = not pp_enabled): no all-gather again in the backward, where
    # each block, and the stage's root (norm and output), reduce-scatters its gradients.
    assert {(c.op, c.phase) for c in fsdp} == {("all_gather", "forward"),
                                               ("reduce_scatter", "backward")}
    blocks = [f"layers.{i}" for i in range(16, 32)]
    for op in ("all_gather", "reduce_scatter"):
        assert sorted(c.module for c in fsdp if c.op == op and c.module.startswith("l")) == \
            sorted(blocks)


@pytest.mark.parametrize("argv", [
    ["llama", "--pp", "2", "--tp", "2", "--rank", "4"],
    ["llama", "--pp", "2", "--ep", "2"],
    ["llama", "--pp", "2", "--cp", "2"],
], ids=["rank-past-the-mesh", "with-ep", "with-cp"])
def test_the_command_refuses_what_it_does_not_compose(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "exportflops: error:" in err
    assert "--tp" in err


def test_in_training_a_stage_rank_does_1_over_tp_of_each_matmuls_three_products():
    model, args = _build("meta")
    count = stage_rank_counter(_build, SMALL.n_layers, 2, tp=TP, fsdp=None,
                               mode="train", strict=True)
    split = count_pipeline(model, args, stages=2, mode="train", device=None, strict=True,
                           count_stage=count, tp=TP)
    # wq on stage 1 (its input, the received hidden state, needs a gradient): the forward,
    # the input's gradient and the weight's gradient, each 2 * tokens * 64 * 64 / tp FLOPs.
    wq = 2 * TOKENS * 64 * (4 * 16) // TP
    assert _module_flops(split.stage_reports[1], "layers.2.attention.wq") == 3 * wq
    # the hidden state's gradient goes back to stage 0, whole (the blocks start replicated)
    backward = [c for c in split.record.stages[1].sends if c.phase == "backward"]
    assert [c.bytes for c in backward] == [BATCH * SEQ * 64 * F32]


def test_analyze_pipeline_takes_a_layout_whose_stages_run_on_tp_ranks():
    model, args = _build("meta")
    split = analyze_pipeline(model, args, layout=Layout(pp=2, tp=TP), mode="train",
                             device=None, strict=True)
    assert (split.record.pp, split.record.tp, split.record.world_size()) == (2, TP, 2 * TP)
    # as above: wq's forward, input gradient and weight gradient, 2 * tokens * 64 * 64 / tp
    # FLOPs each, on stage 1's rank
    wq = 2 * TOKENS * 64 * (4 * 16) // TP
    assert _module_flops(split.stage_reports[1], "layers.2.attention.wq") == 3 * wq


@pytest.mark.parametrize(("options", "words"), [
    ({}, r"needs stages= \(a count, split points, stage modules or Stages\) or layout="),
    ({"stages": 2, "layout": Layout(pp=2, tp=TP)},
     r"splits the model into layout.pp=2 ranks itself .* give stages= without layout="),
], ids=["neither", "both"])
def test_analyze_pipeline_takes_its_stages_or_a_layout(options, words):
    model, args = _build("meta")
    with pytest.raises(InputError, match=words):
        analyze_pipeline(model, args, **options)


def test_a_stages_own_collectives_lengthen_its_actions_on_the_link():
    model, args = _build("meta")
    count = stage_rank_counter(_build, SMALL.n_layers, 2, tp=TP, fsdp=None,
                               mode="forward")
    record = count_pipeline(model, args, stages=2, mode="forward", microbatches=1,
                            count_stage=count, link_bytes_per_s=1e9).record
    first = record.stages[0]
    # Stage 0's rank all-reduces the (2, 16, 64) float32 hidden state after the embedding and
    # after wo and w2 of layers 0 and 1: 5 x 8192 bytes, a bus-bandwidth factor of
    # 2 (n - 1) / n = 1 at n = 2, over 1e9 B/s.
    assert first.forward_collectives_s == pytest.approx(5 * BATCH * SEQ * 64 * F32 / 1e9)
    (action,) = [a for a in record.timeline if a.stage == 0]
    assert action.end_s - action.start_s == pytest.approx(
        first.forward_s + first.forward_collectives_s)


def test_fsdp2_gathers_and_reduces_a_stage_once_per_step_around_its_microbatches():
    model, args = _build("meta")
    count = stage_rank_counter(_build, SMALL.n_layers, 2, tp=None, fsdp=2,
                               mode="train", strict=True)
    record = count_pipeline(model, args, stages=2, schedule="gpipe", mode="train",
                            microbatches=4, count_stage=count, link_bytes_per_s=1e9).record
    # A stage's units keep their parameters gathered after the forward (torchtitan's
    # reshard_after_forward=False under pipelining), and torch turns gradient sync and
    # resharding off for each microbatch's backward: it gathers once before its first forward
    # and reduce-scatters once after its last backward (stage.py, backward_maybe_with_nosync,
    # perform_reduce_grad; schedules.py, UNSHARD and REDUCE_GRAD). Each unit's message is its
    # whole parameters (or gradient), float32: a block's wq 64x64, wk and wv 64x32, wo 64x64,
    # w1, w2, w3 64x128 and two norms of 64; the first stage's root unit holds the 256x64
    # embedding, the last's the norm and the 256x64 output. A rank receives (n - 1)/n = 1/2 of
    # each at n = 2, over 1e9 B/s.
    block = (64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3 + 2 * 64) * F32
    roots = (256 * 64 * F32, (64 + 256 * 64) * F32)
    for stage, root in zip(record.stages, roots):
        once = (2 * block + root) / 2 / 1e9
        assert (stage.unshard_s, stage.reduce_grad_s) == (pytest.approx(once),
                                                          pytest.approx(once))
        assert (stage.forward_collectives_s, stage.backward_collectives_s) == (0, 0)
        mine = [a for a in record.timeline if a.stage == stage.index]
        (gather,) = [a for a in mine if a.kind == "unshard"]
        (reduce,) = [a for a in mine if a.kind == "reduce_grad"]
        first = min((a for a in mine if a.kind == "forward"), key=lambda a: a.start_s)
        last = max((a for a in mine if a.kind == "backward"), key=lambda a: a.end_s)
        # each rank's first action; the later stage's forward still waits on its input
        assert (gather.microbatch, gather.start_s) == (None, 0)
        assert gather.end_s <= first.start_s
        assert (reduce.microbatch, reduce.start_s) == (None, last.end_s)
        assert gather.end_s - gather.start_s == pytest.approx(once)
        assert reduce.end_s - reduce.start_s == pytest.approx(once)
