"""The memory of a pipeline stage's rank with tp or fsdp (`exportflops.parallel.memory_ranks`
with ``Layout(pp=2, tp=2)`` or ``Layout(pp=2, fsdp=2)``) for transformers decoders other than
Llama: Qwen2 (biased q/k/v projections, sliding-window layers) and Qwen3 (per-head q/k norms),
what the last stage's rank holds derived from their configs and transformers'
``base_model_tp_plan`` (q/k/v/gate/up and the untied lm_head split by columns, biases with
them, o/down by rows, the norms whole)."""

from __future__ import annotations

import json

import pytest
import torch

import exportflops
from exportflops.parallel import Layout, memory_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32, STEP = 4, 4  # bytes per float32 element; AdamW's 0-dim float32 step per parameter
SEQ, MICROBATCHES = 32, 2
D, F, VOCAB, HD = 64, 128, 256, 16  # hidden, SwiGLU columns, tokens, head width
Q, KV = 4 * HD, 2 * HD  # 4 query heads, 2 key/value heads
SIZES = {"hidden_size": D, "intermediate_size": F, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": HD,
         "vocab_size": VOCAB, "max_position_embeddings": 64}
#: Qwen2's last two layers on sliding windows of 8 tokens (``max_window_layers``), the
#: last stage's: its masks are made, not skipped as the causal one is under SDPA.
QWEN2 = {"model_type": "qwen2", **SIZES, "use_sliding_window": True, "sliding_window": 8,
         "max_window_layers": 2}
QWEN3 = {"model_type": "qwen3", **SIZES}
#: A layer's split weights: q, o (D x Q), k, v (D x KV), gate, up, down (D x F).
SPLIT = 2 * D * Q + 2 * D * KV + 3 * D * F


def _qwen2_layer(tp: int) -> tuple[int, int]:
    """A Qwen2 layer's elements on a rank of ``tp`` and its parameters: the split weights
    and q/k/v's biases (Q + 2 KV, split with their columns), its two RMSNorms (D each)."""
    return (SPLIT + Q + 2 * KV) // tp + 2 * D, 7 + 3 + 2


def _qwen3_layer(tp: int) -> tuple[int, int]:
    """A Qwen3 layer's: the split weights (no biases), its two RMSNorms and the q and k
    norms over a head (HD each), whole on every rank."""
    return SPLIT // tp + 2 * D + 2 * HD, 7 + 2 + 2


def _last_stage(layer, tp: int) -> tuple[int, int]:
    """The last stage's elements on a rank of ``tp`` and its parameters: layers 2 and 3, the
    final norm (D) and the lm_head (D x VOCAB, by columns)."""
    elements, parameters = layer(tp)
    return 2 * elements + D + D * VOCAB // tp, 2 * parameters + 2


def _rank(config: dict, layout: Layout, rank: int, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return memory_ranks(lambda device: exportflops.hf.build(tmp_path, seq=SEQ, device=device),
                        layout=layout, rank=rank, schedule="gpipe", microbatches=MICROBATCHES)


@pytest.mark.parametrize(("config", "layer", "held"), [
    (QWEN2, _qwen2_layer, 2 * (18496 + 128) + 64 + 8192),
    (QWEN3, _qwen3_layer, 2 * (18432 + 160) + 64 + 8192)], ids=["qwen2", "qwen3"])
def test_a_pp_by_tp_rank_of_a_qwen_holds_its_last_stages_shards(config, layer, held,
                                                                 tmp_path):
    report = _rank(config, Layout(pp=2, tp=2), 3, tmp_path)  # the last stage, tp index 1
    elements, parameters = _last_stage(layer, 2)
    assert elements == held
    # 1. the stage's shards, their gradients, and AdamW's two states per element with a
    #    step for each parameter.
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (
        held * F32, held * F32, 2 * held * F32 + parameters * STEP)
    # 2. a buffer per microbatch for what the stage receives, whole on every tp rank: the
    #    hidden state (1, T, D) and the rotary tables, (1, T, HD) each.
    assert report.max_by_kind.inputs == MICROBATCHES * (SEQ * D + 2 * SEQ * HD) * F32


def test_a_pp_by_fsdp_rank_of_a_qwen2_keeps_its_whole_stage_gathered(tmp_path):
    report = _rank(QWEN2, Layout(pp=2, fsdp=2), 2, tmp_path)  # the last stage, fsdp index 0
    # 1. FSDP2 shards each unit on dim 0 over 2 ranks (every dim even, the biases' too);
    #    under pp each unit stays gathered from its first forward to the step's reduce.
    elements, parameters = _last_stage(_qwen2_layer, 1)
    stage = elements * F32
    assert stage == 4 * (2 * (36992 + 128) + 64 + 16384)
    assert report.max_by_kind.parameters == stage // 2 + stage
    # 2. the unsharded gradients accumulate over the microbatches, reduce-scattered unit by
    #    unit after the last: at least the whole stage, less than every shard on top.
    assert stage <= report.max_by_kind.gradients < stage + stage // 2
    # 3. AdamW's states are the shards'.
    assert report.max_by_kind.optimizer == 2 * (stage // 2) + parameters * STEP
