"""A Hugging Face decoder's pipeline stages on a tensor-parallel mesh: one rank of the whole
model counted once and cut into the stages torch's split makes
(`exportflops.parallel.pipeline_slices`). The cut is checked against torch's split itself (two
independent ways to the same per-stage counts), and the composed command by hand."""

from __future__ import annotations

import json

import pytest

import exportflops
from exportflops.cli import main
from exportflops.parallel.pipeline import analyze_pipeline, layer_split_points
from exportflops.parallel.pipeline_slices import sliced
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


@pytest.mark.parametrize("differentiates", [True, False], ids=["by-gradient", "by-module"])
def test_the_cut_of_the_whole_report_is_torchs_split(decoder, differentiates):
    model, args, kwargs = exportflops.hf.build(decoder, seq=SEQ)
    split = analyze_pipeline(model, args, kwargs, stages=4, schedule="gpipe", device=None)
    whole = exportflops.analyze(model, args, kwargs, mode="train")
    if not differentiates:  # a rank graph's backward names no forward node: the module rule
        whole = whole.model_copy(update={"nodes": [
            n.model_copy(update={"differentiates": ""}) for n in whole.nodes]})
    cut = sliced(whole, model, layer_split_points(model, 4))
    for stage, report in zip(split.record.stages, cut):
        assert (report.total - report.backward, report.backward, report.params) == \
            (stage.forward, stage.backward, stage.params)


def test_a_decoder_on_pp_by_tp_is_one_tensor_parallel_rank_cut_in_stages(decoder, capsys):
    argv = [f"hf:{decoder}", "--seq", str(SEQ), "--pp", "2", "--tp", "2", "--format", "json"]
    assert main([*argv, "--rank", "3"]) == 0
    record = PipelineReport.model_validate_json(capsys.readouterr().out)
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
    assert main([f"hf:{decoder}", "--seq", str(SEQ), "--tp", "2", "--format", "json"]) == 0
    rank = exportflops.Report.model_validate_json(capsys.readouterr().out)
    assert first.forward + last.forward == rank.total - rank.backward
    assert first.params + last.params == rank.params


def test_a_decoder_on_pp_by_fsdp_is_refused_with_the_next_step(decoder, capsys):
    assert main([f"hf:{decoder}", "--pp", "2", "--fsdp", "2"]) == 2
    assert "--pp with --fsdp" in capsys.readouterr().err
