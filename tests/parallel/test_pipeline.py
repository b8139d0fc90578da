"""Pipeline parallelism: stages split as torch.distributed.pipelining splits them, their counts
against the single-device count, their sends, and the bubble of torch's schedules.

The bubble figures are Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2): with p stages of equal time, m microbatches and
t_f + t_b per microbatch and stage, GPipe and 1F1B take (m + p - 1)(t_f + t_b) for m(t_f + t_b)
of work per rank, a bubble of (p - 1)/(m + p - 1) of the step ((p - 1)/m of the ideal time);
the interleaved schedule with v stages per rank, each 1/v of the work, shrinks the bubble time
to (p - 1)(t_f + t_b)/v: (p - 1)/(v m + p - 1) of the step, (p - 1)/(v m) of the ideal.
"""

from __future__ import annotations

import json

import pytest
import torch

import exportflops
from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.api import count_call
from exportflops.parallel.pipeline import analyze_pipeline, layer_split_points
from exportflops.parallel.pipeline.analysis import count_pipeline
from exportflops.parallel.pipeline.schedules import pipeline_order, timeline
from exportflops.records.pipeline import PipelineReport
from exportflops.render.pipeline import pipeline_view

F32 = 4  # bytes per float32 element
SMALL = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                    ffn_dim=128, max_seq_len=64)
BATCH, SEQ = 2, 16
TOKENS = BATCH * SEQ


@pytest.fixture(scope="module")
def small_llama():
    model, args = llama("meta", SMALL, seq_len=SEQ, batch=BATCH)
    return model, args


@pytest.fixture(scope="module")
def llama_split(small_llama):
    model, args = small_llama
    return analyze_pipeline(model, args, stages=2, schedule="1f1b", microbatches=4)


def test_stages_of_the_llama_add_up_to_the_single_device_count(small_llama, llama_split):
    model, args = small_llama
    whole = exportflops.analyze(model, args, mode="train")
    stages = llama_split.record.stages
    assert sum((s.forward + s.backward for s in stages), exportflops.Cost()) == whole.total
    assert sum((s.backward for s in stages), exportflops.Cost()) == whole.backward
    assert sum(s.params for s in stages) == whole.params


def test_the_first_stage_holds_the_embedding_and_the_last_the_head(llama_split):
    first, last = llama_split.record.stages
    # 4 layers in 2 stages: layer 4 * 1 // 2 = 2 starts the second.
    assert first.modules == ["tok_embeddings", "layers.0", "layers.1"]
    assert last.modules == ["layers.2", "layers.3", "norm", "output"]
    # Parameters: a layer is wq, wo (dim x heads*hd = 64 x 64 each), wk, wv (64 x 32 each),
    # w1, w2, w3 (64 x 128 each) and two norms of 64.
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert first.params == 256 * 64 + 2 * layer  # the embedding, vocab x dim
    assert last.params == 2 * layer + 64 + 64 * 256  # the final norm, the head dim x vocab
    head = llama_split.stage_reports[1].module("output")
    assert head.inclusive.macs - head.backward.macs == TOKENS * SMALL.dim * SMALL.vocab_size
    # Its backward: the input's gradient and the weight's, each tokens x dim x vocab.
    assert head.backward.macs == 2 * TOKENS * SMALL.dim * SMALL.vocab_size
    embedding = llama_split.stage_reports[0].module("tok_embeddings")
    assert embedding.inclusive.macs == 0  # a gather: no multiply-accumulate


def test_sends_are_the_hidden_state_and_the_rotary_tables_and_one_gradient(llama_split):
    first, last = llama_split.record.stages
    hidden, table = BATCH * SEQ * SMALL.dim * F32, SEQ * SMALL.head_dim * F32
    assert [(c.op, c.phase, c.bytes, c.peer) for c in first.sends] == [
        ("send", "forward", hidden, 1), ("send", "forward", table, 1),
        ("send", "forward", table, 1)]
    # The rotary tables need no gradient: only the hidden state's goes back.
    assert [(c.op, c.phase, c.bytes, c.peer) for c in last.sends] == [
        ("send", "backward", hidden, 0)]
    assert [(c.op, c.phase, c.bytes, c.peer) for c in last.receives] == [
        ("recv", "forward", hidden, 0), ("recv", "forward", table, 0),
        ("recv", "forward", table, 0)]
    assert [(c.op, c.bytes) for c in first.receives] == [("recv", hidden)]
    rank1 = llama_split.stage_reports[1]
    assert (rank1.world_size, rank1.rank) == (2, 1)
    assert rank1.collectives == [*last.sends, *last.receives]


def test_splitting_leaves_the_users_model_as_it_was(small_llama, llama_split):
    model, _ = small_llama
    # torch's pipeline() wraps each split module's forward in place; we put it back.
    assert "forward" not in vars(model.layers[2])
    assert "_orig_forward" not in vars(model.layers[2])


def test_a_hugging_face_decoder_splits_by_layer_and_adds_up(tmp_path):
    pytest.importorskip("transformers")
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, args, kwargs = exportflops.hf.build(tmp_path, seq=SEQ)
    assert layer_split_points(model, 2) == ["model.layers.2"]
    analysis = analyze_pipeline(model, args, kwargs, stages=2, schedule="gpipe", device=None)
    whole = exportflops.analyze(model, args, kwargs, mode="train")
    stages = analysis.record.stages
    assert sum((s.forward + s.backward for s in stages), exportflops.Cost()) == whole.total
    assert stages[0].modules[0] == "model.embed_tokens"
    assert stages[-1].modules[-2:] == ["model.norm", "lm_head"]
    head = analysis.stage_reports[-1].module("lm_head")
    # Tokens (batch 1 x SEQ) x hidden x vocab.
    assert head.inclusive.macs - head.backward.macs == SEQ * 64 * 256


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (3, 5), (4, 4), (4, 8), (2, 1)],
                         ids=lambda v: str(v))
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    forward, backward = 1.0, 2.0  # any equal-stage times: the fraction does not depend on them
    order = pipeline_order(schedule, p, m, 1)
    _, ranks, step, bubble, _ = timeline(order, lambda s, kind: forward if kind == "F"
                                         else backward)
    assert step == pytest.approx((m + p - 1) * (forward + backward))
    assert bubble == pytest.approx((p - 1) / (m + p - 1))
    assert all(r.busy_s == pytest.approx(m * (forward + backward)) for r in ranks)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 2), (4, 4, 4)],
                         ids=lambda v: str(v))
def test_interleaved_1f1b_bubble_is_smaller_by_v(p, m, v):
    # Each of a rank's v stages does 1/v of its work per microbatch.
    forward, backward = 1.0 / v, 2.0 / v
    order = pipeline_order("interleaved1f1b", p, m, v)
    _, ranks, step, bubble, _ = timeline(order, lambda s, kind: forward if kind == "F"
                                         else backward)
    ideal = m * 3.0  # m microbatches x (t_f + t_b) of the whole rank
    assert (step - ideal) / ideal == pytest.approx((p - 1) / (v * m))  # v times (p-1)/m
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1))
    assert [r.stages for r in ranks] == [[r + k * p for k in range(v)] for r in range(p)]


def test_torchs_interleaved_schedule_needs_microbatches_a_multiple_of_its_rounds():
    # torch: rounds = max(1, m // p), m % rounds == 0; p = 4, m = 9: 2 rounds, 9 % 2 = 1.
    with pytest.raises(InputError, match="ScheduleInterleaved1F1B refuses"):
        pipeline_order("interleaved1f1b", 4, 9, 2)
    assert pipeline_order("interleaved1f1b", 4, 6, 2)  # 1 round: any m


def test_a_schedule_outside_the_table_is_refused_by_name():
    # DualPipe (not its V form) runs every stage on two ranks: not in the table.
    with pytest.raises(InputError, match="no pipeline schedule 'dualpipe'"):
        pipeline_order("dualpipe", 2, 4, 2)


def test_the_dualpipev_timeline_in_unit_actions_by_hand():
    order = pipeline_order("dualpipev", 2, 4, 2)
    # torch's order, each OVERLAP_F_B pair (P, B) run forward first, P a paired forward:
    #   rank 0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0P3 3B1) (3P2 0B0) 3B2 (3P3 0B1) 3B3 0I2 0W2 0I3 0W3
    #   rank 1: 1F0 2F0 1F1 2F1 1F2 2B0 (2P2 1B0) (1P3 2B1) (2P3 1B1) 2B2 1B2 2I3 1I3 2W3 1W3
    assert order[0][7:9] == [(0, "P", 3), (3, "B", 1)]
    assert {r: sorted({s for s, _, _ in a}) for r, a in order.items()} == {0: [0, 3], 1: [1, 2]}
    unit = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}  # a whole backward is its I and W
    actions, ranks, step, bubble, slowest = timeline(order, lambda s, kind: unit[kind])
    # torch sends a paired forward's output after the pair: another rank gets it when the
    # pair's backward ends. rank 0: 0F0 [0,1] 0F1 [1,2] 0F2 [2,3]; rank 1: 1F0 [1,2] 2F0 [2,3]
    # 1F1 [3,4] 2F1 [4,5] 1F2 [5,6]. Rank 0: 3F0 (after 2F0) [3,4] 3I0 [4,5] 3W0 [5,6] 3F1
    # (after 2F1) [6,7] 0P3 [7,8] 3B1 [8,10]. Rank 1: 2B0 (after 3I0) [6,8] 2P2 [8,9] 1B0
    # [9,11] 1P3 (after 0P3's pair, 10) [11,12] 2B1 (after 3B1) [12,14] 2P3 [14,15] 1B1
    # [15,17]. Rank 0: 3P2 (after 2P2's pair, 11) [11,12] 0B0 (after 1B0) [12,14] 3B2 [14,16]
    # 3P3 (after 2P3's pair, 17) [17,18] 0B1 (after 1B1) [18,20] 3B3 [20,22]. Rank 1: 2B2
    # (after 3B2) [17,19] 1B2 [19,21] 2I3 (after 3B3) [22,23] 1I3 [23,24] 2W3 [24,25] 1W3
    # [25,26]. Rank 0: 0I2 (after 1B2) [22,23] 0W2 [23,24] 0I3 (after 1I3) [24,25] 0W3
    # [25,26]. Each rank: 2 stages x 4 microbatches x (1 + 2) = 24 busy units.
    assert step == 26 and slowest == 0
    assert [(r.busy_s, r.end_s) for r in ranks] == [(24, 26), (24, 26)]
    assert bubble == pytest.approx(1 - 48 / (2 * 26))
    three_f2 = next(a for a in actions if (a.stage, a.kind, a.microbatch) == (3, "forward", 2))
    assert (three_f2.start_s, three_f2.end_s) == (11, 12)
    assert {a.kind for a in actions} == {"forward", "backward", "backward_input",
                                         "backward_weight"}


def test_dualpipev_stages_through_analyze_pipeline_take_two_units_for_a_whole_backward():
    x = torch.randn(8, 32, device="meta")
    with torch.device("meta"):
        model = Stack()
    record = analyze_pipeline(model, (x,), stages=4, schedule="dualpipev", microbatches=4,
                              device=None).record
    # Unit times: F, I and W one each, a whole backward B their two: the hand timeline above.
    assert [(s.forward_s, s.backward_s) for s in record.stages] == [(1, 2)] * 4
    assert record.step_time_s == 26


class NormedStack(torch.nn.Module):
    """Four layer norms, each before a linear: layer norm's backward kernel serves both passes
    of a split backward (its input's gradient, its weight's and bias'), so it runs in each."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(32),
                                                              torch.nn.Linear(32, 32))
                                          for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("model, shorter", [(lambda: Stack(), False),
                                             (lambda: NormedStack(), True)],
                         ids=["linears", "layer-norms"])
def test_a_dualpipev_whole_backward_runs_a_kernel_of_both_passes_once(model, shorter):
    x = torch.randn(8, 32, device="meta")
    with torch.device("meta"):
        built = model()
    record = analyze_pipeline(built, (x,), stages=4, schedule="dualpipev",
                              microbatches=4).record
    # A linear's two gradients are two kernels, one per pass: the whole backward is the two
    # passes. Layer norm's one kernel runs in each pass (each with its own output mask) and
    # once in the whole backward: shorter than the passes.
    for stage in record.stages[1:]:
        passes = stage.backward_input_s + stage.backward_weight_s
        assert (stage.backward_s < passes) if shorter else stage.backward_s == pytest.approx(
            passes)


def test_dualpipev_needs_two_stages_per_rank_and_2p_microbatches():
    with pytest.raises(InputError, match="ScheduleDualPipeV refuses"):
        pipeline_order("dualpipev", 2, 3, 2)  # 3 microbatches < 4 stages
    with pytest.raises(InputError, match="runs 2 or more stages per rank"):
        pipeline_order("dualpipev", 2, 4, 1)


def test_the_zbv_timeline_in_unit_actions_by_hand():
    order = pipeline_order("zbvzerobubble", 2, 2, 2)
    # torch's ZB-V places stages in a V: rank 0 holds 0 and 3, rank 1 holds 1 and 2.
    assert {r: sorted({s for s, _, _ in a}) for r, a in order.items()} == {0: [0, 3], 1: [1, 2]}
    actions, ranks, step, bubble, slowest = timeline(order, lambda s, kind: 1.0)
    # torch's order, one unit each (F forward, I input gradients, W weight gradients):
    #   rank 0: 0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1
    #   rank 1: 1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1
    # rank 0: 0F0 [0,1], 0F1 [1,2]; 3F0 needs 2F0, which rank 1 runs [2,3] after 1F0 [1,2]:
    # idle [2,3], then 3F0 [3,4] 3I0 3W0 [5,6]; 3F1 needs 2F1: rank 1 runs 1F1 [3,4], 2F1
    # [4,5], so 3F1 [6,7] 3I1 3W1 [8,9]; 0I0 needs 1I0: rank 1 runs 2I0 [5,6] (after 3I0
    # [4,5]) 2W0 [6,7] 1I0 [7,8], so 0I0 [9,10] 0W0 [10,11]; 0I1 needs 1I1: rank 1 runs 1W0
    # [8,9] 2I1 [9,10] 2W1 [10,11] 1I1 [11,12] 1W1 [12,13], so 0I1 [12,13] 0W1 [13,14].
    assert step == 14 and slowest == 0
    assert [(r.busy_s, r.end_s) for r in ranks] == [(12, 14), (12, 13)]
    assert bubble == pytest.approx(1 - 24 / (2 * 14))
    kinds = {a.kind for a in actions}
    assert kinds == {"forward", "backward_input", "backward_weight"}


def test_zero_bubble_stages_are_counted_in_two_passes_and_timed_by_them():
    x = torch.randn(8, 32, device="meta")
    with torch.device("meta"):
        model = Stack()
    record = analyze_pipeline(model, (x,), stages=4, schedule="zbvzerobubble",
                              microbatches=4).record
    assert [s.rank for s in record.stages] == [0, 1, 1, 0]
    grad_x = grad_w = 8 * 32 * 32  # each stage is one Linear(32, 32) on 8 rows
    first, *rest = record.stages
    # The first stage's input needs no gradient: its whole backward is the weight pass.
    assert first.backward_weight == first.backward and first.backward_input_s == 0
    assert first.backward.macs == grad_w
    for stage in rest:
        assert stage.backward.macs == grad_x + grad_w
        assert stage.backward_weight.macs == grad_w
        assert stage.backward_s == pytest.approx(stage.backward_input_s
                                                 + stage.backward_weight_s)
    done = {(a.stage, a.kind, a.microbatch): a for a in record.timeline}
    for (stage, kind, mb), action in done.items():
        if kind == "backward_weight":  # after its own input pass
            assert action.start_s >= done[(stage, "backward_input", mb)].end_s
        if kind == "backward_input" and stage < 3:  # after the next stage's
            assert action.start_s >= done[(stage + 1, "backward_input", mb)].end_s
    assert PipelineReport.model_validate_json(record.model_dump_json()) == record


def test_the_command_lays_out_a_zero_bubble_step(capsys, tmp_path):
    code = main(["llama", "--pp", "2", "--schedule", "zbvzerobubble", "--microbatches", "4",
                 "--mode", "train", "--format", "json"])
    assert code == 0
    record = PipelineReport.model_validate_json(capsys.readouterr().out)
    assert (record.torch_schedule, record.stages_per_rank) == ("ScheduleZBVZeroBubble", 2)
    assert {a.kind for a in record.timeline} == {"forward", "backward_input",
                                                  "backward_weight"}
    first = record.stages[0]  # token ids need no gradient: all of it in the weight pass
    assert first.backward_input_s == 0 and first.backward_weight == first.backward
    page = tmp_path / "zb.html"
    assert main(["llama", "--pp", "2", "--schedule", "zbvzerobubble", "--mode", "train",
                 "--format", "html", "--output", str(page)]) == 0
    assert "weight gradients (W)" in page.read_text()


def test_the_first_stage_runs_its_whole_backward_in_the_weight_pass():
    # torch's stage 0 skips the input pass whatever its input needs (stage.py, is_first).
    x = torch.randn(8, 32, device="meta", requires_grad=True)
    with torch.device("meta"):
        model = Stack()
    record = analyze_pipeline(model, (x,), stages=4, schedule="zbvzerobubble",
                              microbatches=2).record
    first, second = record.stages[:2]
    grad = 8 * 32 * 32  # grad_x or grad_W of one Linear(32, 32) on 8 rows
    assert first.backward.macs == 2 * grad and first.backward_weight == first.backward
    assert first.backward_input_s == 0
    assert second.backward_weight.macs == grad  # a later stage alike it is split all the same
    assert second.counted_as == 1


def test_zero_bubble_schedules_refuse_what_does_not_split_the_backward():
    x = torch.randn(8, 32)
    model = Stack()
    with pytest.raises(InputError, match="split_backward=True"):
        count_pipeline(model, (x,), stages=4, schedule="interleavedzerobubble",
                       count_stage=lambda s, rank, stage: count_call(
                           stage.module, stage.args, mode="train"))


class Stack(torch.nn.Module):
    """Four equal linears: equal stages when split in two."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_equal_stages_on_the_roofline_give_the_gpipe_bubble():
    x = torch.randn(8, 32, device="meta", requires_grad=True)  # stage 0 sends a gradient too
    with torch.device("meta"):
        model = Stack()
    p, m = 2, 6
    record = analyze_pipeline(model, (x,), stages=p, schedule="gpipe", microbatches=m).record
    first, last = record.stages
    assert (first.forward_s, first.backward_s) == (last.forward_s, last.backward_s)
    assert record.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert record.step_time_s == pytest.approx(
        (m + p - 1) * (first.forward_s + first.backward_s))
    # GPipe: rank 0 runs the last backward.
    assert record.slowest_rank == 0
    assert PipelineReport.model_validate_json(record.model_dump_json()) == record


def test_stage_modules_the_user_built_are_chained():
    x = torch.randn(8, 32, device="meta")
    with torch.device("meta"):
        stages = [torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)]
    record = analyze_pipeline(None, (x,), stages=stages, schedule="1f1b",
                              microbatches=2, device=None).record
    first, last = record.stages
    assert first.forward.macs == 8 * 32 * 16 and last.forward.macs == 8 * 16 * 4
    assert [c.bytes for c in first.sends] == [8 * 16 * F32]  # the (8, 16) activation
    # Stage 0's input needs no gradient: its backward is the weight's only; stage 1's has both.
    assert first.backward.macs == 8 * 32 * 16 and last.backward.macs == 2 * 8 * 16 * 4


def test_forward_mode_runs_the_schedules_forwards_only(small_llama):
    model, args = small_llama
    record = analyze_pipeline(model, args, stages=2, schedule="gpipe", microbatches=3,
                              mode="forward", device=None).record
    assert {a.kind for a in record.timeline} == {"forward"}
    # Unit forwards: m + p - 1 = 4 slots, each rank busy 3.
    assert record.step_time_s == 4 and record.bubble_fraction == pytest.approx(1 / 4)
    assert all(not s.backward.flops for s in record.stages)
    assert {c.phase for s in record.stages for c in [*s.sends, *s.receives]} == {"forward"}


def test_the_view_marks_the_rank_and_names_the_one_that_sets_the_step(llama_split):
    text = pipeline_view(llama_split.record, rank=1)
    assert "tok_embeddings, layers.0-1" in text and "layers.2-3, norm, output" in text
    assert f"set by rank {llama_split.record.slowest_rank}" in text
    assert "   1 *" in text


def test_the_pipeline_of_the_built_in_llama_on_two_ranks():
    from exportflops.parallel import Layout, analyze_ranks

    model, args = llama("meta")  # as `exportflops llama --pp 2` builds it
    record = analyze_ranks(model, args, layout=Layout(pp=2), microbatches=4, schedule="1f1b")
    assert (record.pp, record.microbatches, record.schedule) == (2, 4, "1f1b")
    first, last = record.stages
    assert first.modules[:2] == ["tok_embeddings", "layers.0"]
    assert last.modules[-2:] == ["norm", "output"]
    # Llama 3 8B on its 8192-token example: the hidden state (1, 8192, 4096) and two rotary
    # tables (8192, 128), float32.
    assert sum(c.bytes for c in first.sends) == (8192 * 4096 + 2 * 8192 * 128) * F32
    assert 0 < record.bubble_fraction < 1


@pytest.mark.parametrize("argv", [
    ["llama", "--pp", "2", "--tp", "2", "--rank", "4"],
    ["llama", "--schedule", "1f1b"],
    ["llama", "--pp", "2", "--rank", "2"],
    ["llama", "--pp", "2", "--schedule", "dualpipe"],
    ["llama", "--pp", "2", "--format", "csv"],
], ids=["past-pp-by-tp", "schedule-without-pp", "rank-out-of-range", "unknown-schedule", "csv"])
def test_the_command_refuses_what_it_cannot_lay_out(argv, capsys):
    assert main(argv) == 2
    assert "exportflops: error:" in capsys.readouterr().err


def test_a_link_delays_each_received_tensor_by_its_bytes_over_the_bandwidth():
    x = torch.randn(8, 32, device="meta", requires_grad=True)
    with torch.device("meta"):
        stages = [torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)]
    # The (8, 32) float32 activation and its gradient: 8 * 32 * 4 = 1024 bytes, 1 s at 1024 B/s.
    record = analyze_pipeline(None, (x,), stages=stages, schedule="gpipe", microbatches=2,
                              device=None, link_bytes_per_s=1024.0).record
    # Unit actions. Rank 0: F0 0-1, F1 1-2. Rank 1: F0 from 1 + 1 = 2 to 3, F1 3-4, B0 4-5,
    # B1 5-6. Rank 0: B0 waits for stage 1's B0 (5) + 1 s: 6-7, B1 7-8.
    assert [(a.rank, a.kind[0], a.microbatch, a.start_s, a.end_s) for a in record.timeline] == [
        (0, "f", 0, 0, 1), (0, "f", 1, 1, 2), (0, "b", 0, 6, 7), (0, "b", 1, 7, 8),
        (1, "f", 0, 2, 3), (1, "f", 1, 3, 4), (1, "b", 0, 4, 5), (1, "b", 1, 5, 6)]
    assert (record.step_time_s, record.slowest_rank) == (8, 0)
    # Each rank busy 4 of 8.
    assert record.bubble_fraction == pytest.approx(1 / 2)


class Ends(torch.nn.Module):
    """Stage 0 of `test_a_tensor_that_skips_a_stage_delays_the_stage_it_goes_to`: the first
    element, and the whole input."""

    def forward(self, x: torch.Tensor):
        return x[:1] * 1.0, x * 1.0


class Bump(torch.nn.Module):
    def forward(self, small: torch.Tensor) -> torch.Tensor:
        return small + 1.0


class Scale(torch.nn.Module):
    def forward(self, small: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
        return big * small


def test_a_tensor_that_skips_a_stage_delays_the_stage_it_goes_to():
    from exportflops.capture.pipeline_split import Stage

    x = torch.randn(1000)
    small, big = Ends()(x)
    stages = [Stage(Ends(), (x,), None, [None]), Stage(Bump(), (small,), None, [0]),
              Stage(Scale(), (Bump()(small), big), None, [1, 0])]
    record = analyze_pipeline(None, (x,), stages=stages, schedule="gpipe", microbatches=1,
                              mode="forward", device=None, link_bytes_per_s=1000.0).record
    # Unit actions, 1000 B/s. Stage 0: 0-1. Stage 1 waits for the first element (4 bytes,
    # 0.004 s): 1.004-2.004. Stage 2 waits for stage 1's output (0.004 s more: 2.008) and for
    # the whole input straight from stage 0 (4000 bytes, 4 s after 1: 5): 5-6.
    assert [a.stage for a in record.timeline] == [0, 1, 2]
    assert [t for a in record.timeline for t in (a.start_s, a.end_s)] == pytest.approx(
        [0, 1, 1.004, 2.004, 5, 6])
    assert [c.peer for c in record.stages[2].receives] == [1, 0]


def test_interleaved_stages_go_round_the_ranks_and_send_back_to_rank_0(small_llama):
    model, args = small_llama
    record = analyze_pipeline(model, args, stages=4, schedule="interleaved1f1b",
                              microbatches=4, stages_per_rank=2, device=None).record
    assert (record.pp, record.stages_per_rank) == (2, 2)
    assert [s.rank for s in record.stages] == [0, 1, 0, 1]  # stage s on rank s % 2
    assert [r.stages for r in record.ranks] == [[0, 2], [1, 3]]
    # Stage 1 (rank 1) sends its output forward to stage 2 on rank 0.
    assert {c.peer for c in record.stages[1].sends if c.phase == "forward"} == {0}
    # Stage 0 sends the rotary tables straight to each later stage that uses them, as torch's
    # split graph passes them; stage 2 shares its rank, so nothing crosses to it.
    hidden, table = BATCH * SEQ * SMALL.dim * F32, SEQ * SMALL.head_dim * F32
    assert [(c.node, c.bytes, c.peer) for c in record.stages[0].sends] == [
        ("stage 0 to stage 1", hidden, 1), ("stage 0 to stage 1", table, 1),
        ("stage 0 to stage 1", table, 1), ("stage 0 to stage 3", table, 1),
        ("stage 0 to stage 3", table, 1)]
    # Unit actions, p = 2, v = 2, m = 4: each rank busy v x m x (F + B) = 2 x 4 x 2 = 16;
    # the bubble is (p - 1) of one stage's F + B: (2 - 1) x 2 = 2.
    assert [r.busy_s for r in record.ranks] == [16, 16]
    assert record.step_time_s == 16 + 2
    assert record.bubble_fraction == pytest.approx((2 - 1) / (2 * 4 + 2 - 1))
