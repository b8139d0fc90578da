"""The memory of a rank of a pipeline composed with tensor parallelism and FSDP2
(`exportflops.parallel.memory_ranks` with ``Layout(pp=2, tp=2)``, ``fsdp=2`` or both): what a
stage rank of a small built-in Llama and of a transformers Llama holds, derived from their
configs, the tensor-parallel plans (torchtitan's for the built-in Llama, transformers'
``base_model_tp_plan`` for the other) and FSDP2 on each stage as torchtitan applies it under
pipeline parallelism (each unit kept gathered after its forward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import exportflops
from exportflops.checkpointing import Blocks
from exportflops.cli import main
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.parallel import Layout, memory_ranks
from exportflops.records import RanksMemory
from tests.footprint.rank_models import (LLAMA_BATCH, LLAMA_MICROBATCHES, LLAMA_SEQ,
                                         SMALL_LLAMA, small_llama)
from tests.torchrun import torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32, STEP = 4, 4  # bytes per float32 element; AdamW's 0-dim float32 step per parameter
SMALL = SMALL_LLAMA
BATCH, SEQ, MICROBATCHES = LLAMA_BATCH, LLAMA_SEQ, LLAMA_MICROBATCHES
TOKENS = BATCH * SEQ
D, F, VOCAB = SMALL.dim, SMALL.ffn_dim, SMALL.vocab_size
Q, KV = SMALL.n_heads * SMALL.head_dim, SMALL.n_kv_heads * SMALL.head_dim  # 64, 32
#: A layer's split weights (wq, wo: D x Q; wk, wv: D x KV; w1, w2, w3: D x F), split 1/tp by
#: the plan (wq, wk, wv, w1, w3 by columns, wo, w2 by rows), and its two RMSNorm weights (D
#: each), replicated; 9 parameters.
LAYER_SPLIT, LAYER_NORMS = 2 * D * Q + 2 * D * KV + 3 * D * F, 2 * D
#: The last stage (layers 2 and 3, the final norm and the output, D x VOCAB by columns): its
#: elements on a rank of ``tp``, and its 2 x 9 + 2 parameters.
LAST_PARAMETERS = 20


def _last_stage(tp: int) -> int:
    return 2 * (LAYER_SPLIT // tp + LAYER_NORMS) + D + D * VOCAB // tp


def _rank(layout: Layout, rank: int, model=small_llama, args=()):
    return memory_ranks(model, args, layout=layout, rank=rank, schedule="gpipe",
                        microbatches=MICROBATCHES)


def test_a_pp_by_tp_rank_holds_its_stages_shards_and_its_microbatches_sharded_activations():
    tp = 2
    report = _rank(Layout(pp=2, tp=tp), rank=2)  # the last stage, tp index 0
    assert (report.world_size, report.rank) == (4, 2)
    # 1. the stage's parameters as the plan splits them: 2 x (18432 + 128) + 64 + 8192.
    held = _last_stage(tp) * F32
    assert held == 181504
    # 2. their gradients (the shards', accumulated over the microbatches in place) and
    #    AdamW's two states per element, with a step for each parameter.
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (held, held, 2 * held + LAST_PARAMETERS * STEP)
    # 3. what autograd saves of one microbatch, N tokens, each rank holding Q / tp query
    #    columns, KV / tp key/value columns and F / tp SwiGLU columns:
    n, q, kv, f = TOKENS, Q // tp, KV // tp, F // tp
    norm = n + n * D  # an RMSNorm's rstd (one per token) and x * rstd
    layer = (
        2 * norm + n * D  # both norms, the second's input (the residual sum)
        + 2 * n * D  # each norm's output, the input of wq/wk/wv and of w1/w3
        + n * q + 2 * n * kv  # q and k after the rotary embedding, v: what SDPA saves
        + n * q + BATCH * SEQ * (SMALL.n_heads // tp)  # its output (wo's input), logsumexp
        + 4 * n * f)  # w1's output, its silu, w3's output, their product (w2's input)
    # The stage's first layer's input is the received buffer; the second's, the final
    # norm's input, its rstd and x * rstd, and its output (the output projection's input).
    saved = 2 * layer + n * D + (2 * n * D + n + n * D)
    assert saved * F32 == 205952
    # GPipe runs every forward before any backward: both microbatches in flight.
    assert report.max_by_kind.activations == MICROBATCHES * saved * F32
    # 4. a buffer per microbatch for what the stage receives, whole on every tp rank: the
    #    hidden state (B, T, D) and the rotary tables (T, hd) each.
    assert report.max_by_kind.inputs == MICROBATCHES * (TOKENS * D + 2 * SEQ * SMALL.head_dim) * F32


def test_a_pp_by_tp_rank_with_its_layers_checkpointed_keeps_their_inputs_only():
    report = memory_ranks(small_llama, layout=Layout(pp=2, tp=2), rank=2, schedule="gpipe",
                          microbatches=MICROBATCHES,
                          checkpoint=Blocks(["layers.2", "layers.3"], []))
    # Each checkpointed layer keeps its input (layer 2's is the received buffer, an input)
    # and the generator's state its recompute replays (torch.get_rng_state(): 5056 bytes on
    # cpu); the final norm keeps its input, rstd and x * rstd, and the output its input.
    n, rng = TOKENS, torch.get_rng_state().nbytes
    kept = n * D * F32 + 2 * rng + (3 * n * D + n) * F32
    assert report.max_by_kind.activations == MICROBATCHES * kept


@pytest.mark.parametrize(("layout", "rank", "tp"), [
    (Layout(pp=2, fsdp=2), 2, 1), (Layout(pp=2, fsdp=2, tp=2), 4, 2)],
    ids=["pp-x-fsdp", "pp-x-fsdp-x-tp"])
def test_a_pp_by_fsdp_rank_holds_its_shards_and_keeps_the_whole_stage_gathered(layout, rank,
                                                                               tp):
    report = _rank(layout, rank)  # the last stage, fsdp (and tp) index 0
    # 1. FSDP2 shards each unit of the stage (each layer, then the stage's root: the final
    #    norm and the output) on dim 0 over 2 ranks, every dim even: half of each, of the
    #    stage's tensor-parallel shards under tp.
    stage = _last_stage(tp) * F32
    sharded = stage // 2
    # 2. torchtitan keeps each unit gathered after its forward under pipeline parallelism,
    #    so from the first microbatch to the step's reduce the whole stage is unsharded too.
    assert report.max_by_kind.parameters == sharded + stage
    # 3. torch's stage runs each backward without gradient sync: the unsharded gradients,
    #    the whole stage's, accumulate over the microbatches and are reduce-scattered into the
    #    shards' after the last, unit by unit (each unit's unsharded ones freed as it goes),
    #    so the peak is the whole unsharded stage and less than every shard on top.
    assert stage <= report.max_by_kind.gradients < stage + sharded
    # 4. AdamW's states are the shards', with a step for each of the stage's parameters.
    assert report.max_by_kind.optimizer == 2 * sharded + LAST_PARAMETERS * STEP


def test_a_pp_by_fsdp_ranks_forwards_hold_its_shards_and_the_whole_stage_gathered():
    report = memory_ranks(small_llama, layout=Layout(pp=2, fsdp=2), rank=2, mode="forward",
                          schedule="gpipe", microbatches=MICROBATCHES)
    # torch's eval() keeps each unit gathered from the first step on (nothing reshards it
    # without a backward): the shards, half of the last stage, and the whole stage.
    stage = _last_stage(1) * F32
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients) == \
        (stage // 2 + stage, 0)


CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "max_position_embeddings": 64}
HF_SEQ = 32


def test_a_transformers_llama_stage_rank_holds_the_shards_of_its_plan(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    report = _rank(Layout(pp=2, tp=2), rank=3,
                   model=lambda device: exportflops.hf.build(tmp_path, seq=HF_SEQ,
                                                             device=device))
    # transformers' Llama plan splits q/k/v/gate/up by columns, o/down by rows, and the
    # untied lm_head by columns: the last stage's sizes are the built-in Llama's (64 wide,
    # 4 heads of 16, 2 key/value heads, 128 SwiGLU columns, 256 tokens).
    held = _last_stage(2) * F32
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients) == (held, held)
    # A buffer per microbatch for the hidden state (1, T, 64) and the rotary tables, which
    # transformers makes (1, T, 16) each.
    assert report.max_by_kind.inputs == MICROBATCHES * (HF_SEQ * 64 + 2 * HF_SEQ * 16) * F32


TINY = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16,
                   ffn_dim=64, max_seq_len=16)


def test_every_rank_of_pp_by_tp_is_reported_and_the_view_names_the_highest():
    view = memory_ranks(lambda device: (*llama(device, TINY, seq_len=8), {}),
                        layout=Layout(pp=2, tp=2), microbatches=2)
    assert [report.rank for report in view.ranks] == [0, 1, 2, 3]
    highest = max(view.ranks, key=lambda report: report.peak_bytes)
    assert (view.peak_rank, view.peak_bytes) == (highest.rank, highest.peak_bytes)
    # The two tensor-parallel ranks of a stage hold shards of the same shapes.
    peaks = [report.peak_bytes for report in view.ranks]
    assert (peaks[0], peaks[2]) == (peaks[1], peaks[3])
    assert RanksMemory.model_validate_json(view.model_dump_json()) == view


def test_the_command_gives_a_pp_by_tp_rank(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    code = main([f"hf:{tmp_path}", "--seq", str(HF_SEQ), "--memory", "--pp", "2", "--tp", "2",
                 "--rank", "3", "--mode", "train", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    # The last stage's rank 1 of 2 tensor-parallel ranks: the shards of its plan (above).
    assert (record["world_size"], record["rank"]) == (4, 3)
    assert record["max_by_kind"]["parameters"] == _last_stage(2) * F32


def test_ranks_of_two_tensor_parallel_groups_run_one_after_the_other_in_one_process():
    # Rank 0's tp group is ranks 0-1, rank 3's is 2-3: each run under its own fake process
    # group, the second on none of the first's groups (DTensor caches its sharding by mesh,
    # and a DeviceMesh compares equal to another rank's of the same layout).
    def build(device):
        return (*llama(device, TINY, seq_len=8), {})

    first, last = (memory_ranks(build, layout=Layout(fsdp=2, tp=2), rank=rank)
                   for rank in (0, 3))
    assert first.peak_bytes == last.peak_bytes  # shards of the same shapes


@pytest.mark.slow  # four processes: 50 to 100 s on two cores shared with other work
def test_four_real_gloo_ranks_of_pp_by_tp_peak_as_the_fake_process_group_predicts(tmp_path):
    # Each rank splits the Llama as memory_ranks splits its fake copy
    # (tests/footprint/pipeline_worker.py "pp-tp"), and runs torch's GPipe over its pp group,
    # steps 2 to 4 measured.
    worker = Path(__file__).with_name("pipeline_worker.py")
    done = torchrun(worker, "gpipe", str(tmp_path), "pp-tp", "3", ranks=4, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    view = memory_ranks(small_llama, layout=Layout(pp=2, tp=2), schedule="gpipe",
                        microbatches=MICROBATCHES)
    for report in view.ranks:
        measured = json.loads((tmp_path / f"rank{report.rank}.json").read_text())["peak_bytes"]
        # the least of three steps (tests/footprint/test_memory_ranks.py says why)
        assert abs(min(measured) - report.peak_bytes) <= 0.03 * min(measured), (
            report.rank, measured, report.peak_bytes)
