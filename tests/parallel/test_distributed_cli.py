"""The command's ``--tp N``: a model split by its own plan, one rank analyzed; and the built-in
Llama's plan (torchtitan's). Expected numbers derived from the shapes, as in
tests/parallel/test_distributed.py (Megatron's split, Shoeybi et al. 2019, section 3)."""

from __future__ import annotations

import pytest
import torch

import exportflops
from tests.cli_support import ROOT, one_paragraph, report_of, run, write_models
from tests.parallel_models import BATCH, FFN, HIDDEN, SEQ

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element


def test_the_command_splits_a_factory_model_by_its_tp_plan_and_reports_the_rank_asked():
    report = report_of(run("tests.parallel_models:planned", "--tp", "2", "--rank", "1",
                           "--mode", "train", "--format", "json", cwd=ROOT))
    assert (report.world_size, report.rank) == (2, 1)
    # up is column-parallel: B*T rows x H x F/2 MACs.
    up = report.module("blocks.0.up")
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * (FFN // 2)
    # down's forward output and up's input gradient, B x T x H float32, all-reduced:
    # 2 * 8 * 16 * 4 = 1024 bytes each.
    assert BATCH * SEQ * HIDDEN * F32 == 1024
    assert [(c.op, c.phase, c.module, c.bytes) for c in report.collectives] == [
        ("all_reduce", "forward", "blocks.0.down", 1024),
        ("all_reduce", "backward", "blocks.0.up", 1024)]


@pytest.mark.parametrize("args, message", [
    (("--tp", "2", "--rank", "2"), "--rank one of 0..1"),
    (("--tp", "2", "--link-gbps", "0"), "--link-gbps 0.0: link_bytes_per_s=0.0: a collective's "
                                       "time is its bytes over the link's bus bandwidth, in "
                                       "bytes/s > 0"),
], ids=["rank_out_of_range", "bandwidth"])
def test_the_command_refuses_tp_options_that_cannot_apply(args, message):
    result = run("tests.parallel_models:planned", *args, cwd=ROOT)
    assert result.returncode == 2 and message in result.stderr and one_paragraph(result.stderr)


def test_the_command_refuses_tp_for_a_model_without_a_plan(tmp_path):
    result = run("cli_models:mlp", "--tp", "2", cwd=write_models(tmp_path))
    assert result.returncode == 2 and "has no tensor-parallel plan" in result.stderr
    assert one_paragraph(result.stderr)


def test_the_built_in_llama_plan_splits_heads_and_all_reduces_after_wo_and_w2():
    from torch.distributed.device_mesh import init_device_mesh

    from exportflops.examples.llama import LlamaConfig, llama
    from exportflops.examples.parallel import parallelize_llama

    tp, seq, dim, heads, kv, hd, ffn, vocab = 2, 8, 32, 4, 2, 8, 64, 64
    config = LlamaConfig(vocab_size=vocab, dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv,
                         head_dim=hd, ffn_dim=ffn, max_seq_len=seq)
    with exportflops.fake_process_group(tp):
        model, args = llama("meta", config, seq_len=seq)
        parallelize_llama(model, init_device_mesh("cpu", (tp,)))
        report = exportflops.analyze(model, args)
    attention = report.module("layers.0.attention")
    # 1. projections: wq T x dim x heads*hd/tp, wk and wv T x dim x kv*hd/tp, wo T x heads*hd/tp
    #    x dim; 2. this rank's heads/tp heads: Q K^T and A V, T x T x hd each.
    projections = seq * dim * (2 * heads + 2 * kv) * hd // tp
    assert attention.inclusive.macs == projections + heads // tp * 2 * seq * seq * hd
    # SwiGLU: w1, w3 (dim -> ffn/tp) and w2 (ffn/tp -> dim) on T tokens.
    assert report.module("layers.0.feed_forward").inclusive.macs == 3 * seq * dim * ffn // tp
    # Embedding (vocabulary-parallel), wo and w2 all-reduce T x dim; the output gathers
    # T x vocab logits.
    assert [(c.op, c.module, c.bytes) for c in report.collectives] == [
        ("all_reduce", "tok_embeddings", seq * dim * F32),
        ("all_reduce", "layers.0.attention.wo", seq * dim * F32),
        ("all_reduce", "layers.0.feed_forward.w2", seq * dim * F32),
        ("all_gather", "output", seq * vocab * F32)]
