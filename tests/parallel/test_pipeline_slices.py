"""A Hugging Face decoder's pipeline stages on a tensor-parallel mesh: one rank of the whole
model counted once and cut into the stages torch's split makes
(`exportflops.parallel.pipeline.slices`). The cut is checked against torch's split itself (two
independent ways to the same per-stage counts), and the composition by hand, through
`exportflops.parallel.analyze_ranks` (the command's refusals through the command)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import exportflops
from exportflops.cli import main
from exportflops.parallel import Layout, analyze_ranks
from exportflops.parallel.pipeline import analyze_pipeline, layer_split_points
from exportflops.capture.pipeline_split import split_stages
from exportflops.aggregate import build_report
from exportflops.api import count_call
from exportflops.parallel.pipeline.slices import (held_parameters, node_stages, received,
                                                  stage_counted)
from exportflops.records.pipeline import PipelineReport

pytest.importorskip("transformers")

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "max_position_embeddings": 64}
SEQ = 32
F32 = 4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def _ranks(decoder, *, mode: str = "forward", schedule: str | None = None,
           rank: int | None = None, **degrees: int):
    """`analyze_ranks` of the decoder on SEQ tokens on ``Layout(**degrees)``: what the command
    prints for ``hf:DECODER --seq SEQ`` with those degrees as flags."""
    return analyze_ranks(*exportflops.hf.build(decoder, seq=SEQ), layout=Layout(**degrees),
                         mode=mode, schedule=schedule, rank=rank)


@pytest.mark.parametrize("differentiates", [True, False], ids=["by-gradient", "by-module"])
def test_the_cut_of_the_whole_report_is_torchs_split(decoder, differentiates):
    model, args, kwargs = exportflops.hf.build(decoder, seq=SEQ)
    split = analyze_pipeline(model, args, kwargs, stages=4, schedule="gpipe", device=None)
    whole = count_call(model, args, kwargs, mode="train")
    if not differentiates:  # a rank graph's backward names no forward node: the module rule
        whole = dataclasses.replace(whole, nodes=[
            n.model_copy(update={"differentiates": ""}) for n in whole.nodes])
    points = layer_split_points(model, 4)
    stage_of = node_stages(whole, points)
    modules = split_stages(model, args, kwargs, points, grad=True)
    cut = [build_report(stage_counted(whole, s, stage_of, held_parameters(model, stage.module),
                                      received(stage))) for s, stage in enumerate(modules)]
    for stage, report in zip(split.record.stages, cut):
        assert (report.total - report.backward, report.backward, report.params) == \
            (stage.forward, stage.backward, stage.params)


def test_a_decoder_on_pp_by_tp_is_one_tensor_parallel_rank_cut_in_stages(decoder):
    record = _ranks(decoder, pp=2, tp=2)
    first, last = record.stages
    assert (record.pp, record.tp, [s.stands_for for s in record.stages]) == \
        (2, 2, [[0, 1], [2, 3]])
    hidden = 1 * SEQ * 64 * F32  # the (1, SEQ, hidden) float32 state a row-parallel layer sums
    # transformers' Llama plan: the embedding is row-parallel, each layer's o_proj and
    # down_proj too (an all-reduce each); lm_head is column-parallel, its logits gathered.
    assert [(c.op, c.bytes, c.module) for c in first.collectives] == [
        ("all_reduce", hidden, "model.embed_tokens"),
        ("all_reduce", hidden, "model.layers.0.self_attn.o_proj"),
        ("all_reduce", hidden, "model.layers.0.mlp.down_proj"),
        ("all_reduce", hidden, "model.layers.1.self_attn.o_proj"),
        ("all_reduce", hidden, "model.layers.1.mlp.down_proj")]
    assert [(c.op, c.bytes) for c in last.collectives][-1] == \
        ("all_gather", 1 * SEQ * 256 * F32)  # the logits, all 256 of the vocabulary
    rank = _ranks(decoder, tp=2, rank=0)
    assert first.forward + last.forward == rank.total - rank.backward
    assert first.params + last.params == rank.params


# The decoder's parameters by hand: a layer is q and o (64 x 64 each), k and v (64 x 32 each:
# 2 key/value heads of 16), gate, up and down (64 x 128 each) and two norms of 64; the
# embedding 256 x 64; the final norm 64 and the untied head 64 x 256.
LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
EMBEDDING, NORM_AND_HEAD = 256 * 64, 64 + 64 * 256


def test_a_decoder_on_pp_by_fsdp_gathers_each_stages_own_parameters(decoder):
    record = _ranks(decoder, pp=2, fsdp=2, mode="train")
    first, last = record.stages
    assert (record.fsdp, [s.stands_for for s in record.stages]) == (2, [[0, 1], [2, 3]])

    def messages(stage, op, phase):
        return [(c.module, c.bytes) for c in stage.collectives
                if c.op == op and c.phase == phase]

    # torchtitan's FSDP2 per stage: each layer a unit, the stage's other parameters one unit
    # standing for its root, all kept gathered after the forward under pipeline parallelism
    # (no all-gather in the backward); an all-gather's bytes are the whole unit's float32
    # parameters, and each unit reduce-scatters its gradients.
    layer, embedding, norm_and_head = LAYER * F32, EMBEDDING * F32, NORM_AND_HEAD * F32
    assert messages(first, "all_gather", "forward") == [
        ("model.embed_tokens", embedding), ("model.layers.0", layer),
        ("model.layers.1", layer)]
    assert messages(last, "all_gather", "forward") == [
        ("model.layers.2", layer), ("model.layers.3", layer), ("model.norm", norm_and_head)]
    assert messages(first, "all_gather", "backward") == []
    assert messages(last, "all_gather", "backward") == []
    assert sorted(messages(first, "reduce_scatter", "backward")) == [
        ("model.embed_tokens", embedding), ("model.layers.0", layer),
        ("model.layers.1", layer)]
    assert sorted(messages(last, "reduce_scatter", "backward")) == [
        ("model.layers.2", layer), ("model.layers.3", layer), ("model.norm", norm_and_head)]
    # Each rank holds half of its stage's parameters.
    assert first.params == (EMBEDDING + 2 * LAYER) // 2
    assert last.params == (2 * LAYER + NORM_AND_HEAD) // 2


def test_a_tied_decoder_on_pp_by_fsdp_is_refused_with_the_next_step(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {**CONFIG, "model_type": "qwen2", "num_hidden_layers": 2, "tie_word_embeddings": True}))
    assert main([f"hf:{tmp_path}", "--seq", "16", "--pp", "2", "--fsdp", "2"]) == 2
    assert "tie_word_embeddings=False" in capsys.readouterr().err


def test_a_tied_decoder_on_pp_by_fsdp_is_refused_naming_the_arguments(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {**CONFIG, "model_type": "qwen2", "num_hidden_layers": 2, "tie_word_embeddings": True}))
    with pytest.raises(exportflops.errors.InputError,
                       match=r"untied \(tie_word_embeddings=False\) for pp= with fsdp="):
        analyze_ranks(*exportflops.hf.build(tmp_path, seq=16), layout=Layout(pp=2, fsdp=2))


def test_a_head_read_by_its_weight_alone_keeps_its_parameters_in_its_stage():
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
            self.head = torch.nn.Linear(8, 32, bias=False)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return torch.nn.functional.linear(x, self.head.weight)  # head runs no node

    model, x = Net(), torch.randn(2, 8)
    whole = count_call(model, (x,), mode="train")
    points = layer_split_points(model, 2)
    stages = split_stages(model, (x,), None, points, grad=True)
    cut = [build_report(stage_counted(whole, s, node_stages(whole, points),
                                      held_parameters(model, st.module), received(st)))
           for s, st in enumerate(stages)]
    # Two Linear(8, 8) a stage (72 each); the last also holds the 8 x 32 head.
    assert [c.params for c in cut] == [2 * 72, 2 * 72 + 8 * 32]


def test_a_tied_head_is_split_with_the_embedding(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {**CONFIG, "model_type": "qwen2", "num_hidden_layers": 2, "tie_word_embeddings": True}))

    def build(device):  # as `exportflops hf:DIR --seq 16` builds it, for each rank
        return tuple(exportflops.hf.build(tmp_path, device=device, seq=16))

    rank = analyze_ranks(build, layout=Layout(tp=2), rank=0)
    # The tied weight is sharded once, on the vocabulary: half of 256 x 64 on each rank, and
    # the head's matmul makes this rank's half of the logits, 16 tokens x 64 x 128.
    assert rank.module("model.embed_tokens").params == 256 * 64 // 2
    assert rank.module("lm_head").inclusive.macs == 16 * 64 * 128
    assert [(c.op, c.bytes) for c in rank.collectives][-1] == ("all_gather", 16 * 256 * F32)
    # and on pipeline stages of tp ranks: rank 3, index 1 of the last stage's group
    assert analyze_ranks(build, layout=Layout(pp=2, tp=2), rank=3).rank == 3


def _zero_bubble(decoder, **degrees: int) -> PipelineReport:
    return _ranks(decoder, pp=2, mode="train", schedule="zbvzerobubble", **degrees)


def test_a_decoder_on_pp_by_tp_splits_each_stages_backward_at_its_input(decoder, monkeypatch):
    """The whole rank's backward cut at each stage's input (what the stage before depends on)
    against torch's split stages each counted with split_backward on one device: every MAC
    of each pass is sharded by the plan, so each pass's MACs halve at tp 2. The whole rank is
    counted once, with its backward split (its stages read off the graph being counted)."""
    from exportflops.parallel import per_rank

    splits = []

    def counted_once(*args, **options):
        splits.append(options.get("split_backward"))
        return count_call(*args, **options)

    monkeypatch.setattr(per_rank, "count_call", counted_once)
    sharded = _zero_bubble(decoder, tp=2)
    monkeypatch.undo()
    assert len(splits) == 1 and callable(splits[0])  # no count of the rank unsplit first
    alone = _zero_bubble(decoder)
    assert [s.modules for s in sharded.stages] == [s.modules for s in alone.stages]
    for on_tp, single in zip(sharded.stages, alone.stages):
        assert on_tp.backward_weight.macs * 2 == single.backward_weight.macs
        assert on_tp.backward.macs * 2 == single.backward.macs
    # Stage 1 is model.layers.1: its weight pass is each linear's weight gradient, one MAC per
    # token and parameter of this rank's half (LAYER less its two norms of 64).
    middle = sharded.stages[1]
    assert middle.backward_weight.macs == SEQ * (LAYER - 2 * 64) // 2
    # The plan's all-reduces of the inputs' gradients (after q, k, v and gate, up) are on the
    # way to the stage's input: its input pass.
    backward = [c for c in middle.collectives if c.phase == "backward"]
    assert backward and {(c.op, c.gradient) for c in backward} == {("all_reduce", "input")}
    assert sharded.stages[0].backward_weight == sharded.stages[0].backward  # torch runs it whole


def test_a_tied_decoder_on_pp_by_tp_refuses_a_schedule_splitting_the_backward(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {**CONFIG, "model_type": "qwen2", "tie_word_embeddings": True}))  # 4 layers: 4 stages
    argv = [f"hf:{tmp_path}", "--seq", "16", "--pp", "2", "--tp", "2", "--mode", "train",
            "--schedule", "zbvzerobubble"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tie_word_embeddings=False" in err and "--schedule" in err


def test_a_decoder_on_pp_by_fsdp_reduces_its_gradients_in_the_weight_pass(decoder):
    """FSDP2's reduce-scatters read the parameters' gradients: the weight pass's, on every
    stage; the stages' two passes together are the whole backward's MACs of the unsplit run."""
    split = _zero_bubble(decoder, fsdp=2)
    for stage in split.stages:
        scatters = [c for c in stage.collectives if c.op == "reduce_scatter"]
        assert scatters and {c.gradient for c in scatters} == {"weight"}
    single = _zero_bubble(decoder)
    assert [s.backward_weight.macs for s in split.stages] == \
        [s.backward_weight.macs for s in single.stages]  # FSDP2 splits no matmul


def test_split_backward_as_a_function_takes_a_parallelized_rank():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(exportflops.errors.InputError, match="not parallelized"):
        exportflops.analyze(model, (torch.zeros(2, 4),), mode="train",
                            split_backward=lambda graph: frozenset())
