"""exportflops.memory and analyze on a decode step over the user's own DynamicCache, filled by a
real prefill: what a user measures to see whether one more token fits."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")

import exportflops  # noqa: E402
from exportflops import MemoryReport  # noqa: E402
from exportflops.generation.cache_names import cache_argument, returned_cache  # noqa: E402
from tests.footprint.models import FP32  # noqa: E402
from tests.footprint.profiled import profiled_after  # noqa: E402

#: Issue 50's bar: the predicted peak within 3% of the profiler's.
TOLERANCE = 0.03
BATCH, PROMPT, LAYERS, HEADS, HEAD_DIM, HIDDEN, MLP, VOCAB = 2, 8, 2, 4, 16, 64, 128, 128
INT64 = 8
#: Key/value heads per model: Llama's grouped (2 of 4 query heads), GPT-2's one per head.
KV_HEADS = {"llama": 2, "gpt2": HEADS}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS[name],
            max_position_embeddings=128)).eval()
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=128)).eval()


def _prompt() -> torch.Tensor:
    return torch.arange(BATCH * PROMPT).reshape(BATCH, PROMPT) % VOCAB


def _next_token() -> torch.Tensor:
    return torch.ones(BATCH, 1, dtype=torch.long)


def _prefilled(model: torch.nn.Module):
    """The cache a real prefill of the prompt fills, as ``generate`` makes it."""
    with torch.no_grad():
        return returned_cache(model(_prompt(), use_cache=True))


def _decode(model: torch.nn.Module, cache):
    with torch.no_grad():
        return model(_next_token(), use_cache=True, **{cache_argument(model): cache})


@functools.cache
def _predicted(name: str) -> MemoryReport:
    model = _model(name)
    return exportflops.memory(model, (_next_token(),),
                              {cache_argument(model): _prefilled(model), "use_cache": True},
                              mode="forward")


@pytest.mark.parametrize("name", KV_HEADS)
def test_a_decode_step_on_a_filled_cache_peaks_as_the_profiler_measures_within_3_percent(name):
    model = _model(name)
    # The prefill runs inside the profile: the profiler sees no free of a tensor made before it.
    measured = profiled_after(lambda: _prefilled(model), lambda cache: _decode(model, cache))
    assert _predicted(name).peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)


@pytest.mark.parametrize("name", KV_HEADS)
def test_the_filled_cache_counts_as_inputs_a_key_and_a_value_per_layer_per_cached_token(name):
    cache = 2 * LAYERS * KV_HEADS[name] * HEAD_DIM * PROMPT * BATCH * FP32  # keys and values
    next_token = BATCH * 1 * INT64
    assert _predicted(name).max_by_kind.inputs == cache + next_token


def _snapshot(cache) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values, layer.keys.clone(), layer.values.clone())
            for layer in cache.layers]


def _unchanged(cache, snapshot) -> bool:
    return cache.get_seq_length() == PROMPT and all(
        layer.keys is keys and layer.values is values
        and torch.equal(keys, keys_then) and torch.equal(values, values_then)
        for layer, (keys, values, keys_then, values_then) in zip(cache.layers, snapshot))


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_memory_leaves_the_users_cache_as_it_was(mode):
    model = _model("llama")
    cache = _prefilled(model)
    snapshot = _snapshot(cache)
    exportflops.memory(model, (_next_token(),), {cache_argument(model): cache, "use_cache": True},
                       mode=mode)
    assert _unchanged(cache, snapshot)


def test_analyze_counts_the_decode_step_over_the_cache_and_leaves_it_as_it_was():
    model = _model("llama")
    cache = _prefilled(model)
    snapshot = _snapshot(cache)
    report = exportflops.analyze(model, (_next_token(),),
                                 {cache_argument(model): cache, "use_cache": True})
    # 1. Per token, each linear's weight once: q and o (64 x 64), k and v (64 x 32: 2 KV heads
    #    of 16), gate, up and down (64 x 128) per layer, and the LM head (64 x 128).
    linears = LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * 2 * HEAD_DIM + 3 * HIDDEN * MLP) \
        + HIDDEN * VOCAB
    # 2. Attention: the new query against the 8 cached keys and its own, scores then values.
    attention = LAYERS * 2 * BATCH * HEADS * 1 * (PROMPT + 1) * HEAD_DIM
    assert report.total.macs == BATCH * linears + attention
    assert _unchanged(cache, snapshot)
