"""analyze_generation with sliding-window layers: transformers' DynamicSlidingWindowLayer keeps
the last W - 1 entries, so a step's attention there reads min(past, W - 1) + 1 keys. The step
costs, KV bytes and the request total are derived by hand below, piecewise in past."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exportflops import GenerationReport, analyze, analyze_generation  # noqa: E402
from exportflops.generation.cache_names import cache_argument  # noqa: E402
from exportflops.generation.decoder import dynamic_cache_pytree  # noqa: E402

# Width 32, 4 query heads and 2 key/value heads of dim 8, SwiGLU of width 48, 2 layers, a
# 64-token vocabulary, untied head; float32. Window W = 6: a sliding layer keeps 5 entries.
WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, LAYERS, W = 32, 4, 2, 8, 48, 64, 2, 6
PROMPT, NEW = 4, 8  # decode steps at past = 4 .. 10, across the window's edge at 5
SIZES = dict(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
             tie_word_embeddings=False)
# Per token: q and o (WIDTH x WIDTH), k and v (WIDTH x KV_HEADS*HEAD_DIM), SwiGLU (3 x WIDTH x
# FFN) per layer, then the head (WIDTH x VOCAB).
LINEAR = LAYERS * (2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD_DIM + 3 * WIDTH * FFN) \
    + WIDTH * VOCAB


def keys(past: int, sliding: bool) -> int:
    """Keys one layer's attention reads at a step with ``past`` tokens seen."""
    return min(past, W - 1) + 1 if sliding else past + 1


def step_macs(past: int, layers_sliding: list[bool]) -> int:
    # q.k and p.v: HEADS x HEAD_DIM MACs per key each.
    return LINEAR + sum(2 * HEADS * HEAD_DIM * keys(past, s) for s in layers_sliding)


def kv_read(past: int, layers_sliding: list[bool]) -> int:
    # Keys and values of each layer: KV_HEADS x HEAD_DIM x 4 bytes per entry read.
    return sum(2 * KV_HEADS * HEAD_DIM * 4 * keys(past, s) for s in layers_sliding)


def _generate(config) -> GenerationReport:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return analyze_generation(model, torch.zeros(1, PROMPT, dtype=torch.long, device="meta"),
                              new_tokens=NEW)


@pytest.fixture(scope="module")
def mistral():  # every layer slides
    return _generate(transformers.MistralConfig(sliding_window=W, **SIZES))


@pytest.fixture(scope="module")
def mixed():  # layer 0 keeps everything, layer 1 slides
    return _generate(transformers.Qwen2Config(use_sliding_window=True, sliding_window=W,
                                              max_window_layers=1, **SIZES))


@pytest.mark.parametrize("case, sliding", [("mistral", [True, True]), ("mixed", [False, True])])
def test_steps_and_kv_bytes_by_hand_on_both_sides_of_the_window(case, sliding, request):
    report = request.getfixturevalue(case)
    assert report.sliding_window == W and list(report.decode_positions) == list(range(4, 11))
    for past in report.decode_positions:
        assert report.step_counts(past).macs == step_macs(past, sliding), past
        assert report.kv_cache_at(past).bytes_read == kv_read(past, sliding), past
        assert report.step(past).total.macs == step_macs(past, sliding)


@pytest.mark.parametrize("case, sliding", [("mistral", [True, True]), ("mixed", [False, True])])
def test_the_request_total_sums_each_side_of_the_window(case, sliding, request):
    report = request.getfixturevalue(case)
    looped = report.prefill.total.macs + sum(step_macs(p, sliding)
                                             for p in report.decode_positions)
    assert report.total.macs == looped
    assert GenerationReport.model_validate_json(report.model_dump_json()) == report


def test_a_step_past_the_window_equals_a_concrete_step_with_transformers_own_cache():
    config = transformers.Qwen2Config(use_sliding_window=True, sliding_window=W,
                                      max_window_layers=1, **SIZES)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    cache = transformers.DynamicCache(config=config)  # the cache generate() makes
    past = 9
    shape = (1, KV_HEADS, past, HEAD_DIM)
    for layer in range(LAYERS):  # layer 1 keeps its last W - 1 entries of the 9
        cache.update(torch.zeros(shape, device="meta"), torch.zeros(shape, device="meta"), layer)
    with dynamic_cache_pytree():
        concrete = analyze(model, (), {"input_ids": torch.zeros(1, 1, dtype=torch.long,
                                                                device="meta"),
                                       cache_argument(model): cache, "use_cache": True})
    assert concrete.total.macs == step_macs(past, [False, True])
