"""The KV cache's bytes per token and per request, and the largest batch a byte budget holds,
derived by hand for the tiny Llama of test_generation.py (2 layers, 2 key/value heads of dim 8,
float32)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exportflops import analyze_generation  # noqa: E402
from exportflops.errors import InputError  # noqa: E402
from tests.generation.test_generation import (  # noqa: E402
    BATCH, HEAD_DIM, ITEMSIZE, KV_HEADS, LAYERS, NEW, PROMPT, _llama)

# One token of one sequence: a key and a value of KV_HEADS x HEAD_DIM per layer.
PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * ITEMSIZE  # 256 B


@pytest.fixture(scope="module")
def prompt():
    return torch.zeros(BATCH, PROMPT, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def dynamic(prompt):
    return analyze_generation(_llama(), prompt, new_tokens=NEW)


@pytest.fixture(scope="module")
def static(prompt):
    return analyze_generation(_llama(), prompt, new_tokens=NEW, cache="static",
                              max_cache_len=16)


def test_a_token_adds_a_key_and_a_value_per_layer_to_its_sequences_cache(dynamic, static):
    assert dynamic.kv_cache_bytes_per_token == static.kv_cache_bytes_per_token == PER_TOKEN


def test_a_requests_cache_holds_each_sequences_tokens_and_a_static_one_its_buffer(dynamic,
                                                                                    static):
    # After the last decode step each sequence holds P + G - 1 = 8 tokens.
    context = PROMPT + NEW - 1
    assert dynamic.kv_cache_bytes(context) == BATCH * context * PER_TOKEN  # 4096 B
    assert dynamic.kv_cache_bytes(1) == BATCH * PER_TOKEN
    # A static cache allocates max_cache_len = 16 entries per sequence whatever the context.
    assert static.kv_cache_bytes(1) == static.kv_cache_bytes(context) == BATCH * 16 * PER_TOKEN


def test_the_largest_batch_is_the_budget_over_one_sequences_cache(dynamic, static):
    # One sequence at 8 tokens: 8 x 256 = 2048 B; 10,000 B holds 4 of them (8192), not 5.
    assert dynamic.largest_batch(10_000, 8) == 4
    assert dynamic.largest_batch(4 * 2048, 8) == 4 and dynamic.largest_batch(4 * 2048 - 1, 8) == 3
    # The static buffer is 16 x 256 = 4096 B per sequence: 2 fit.
    assert static.largest_batch(10_000, 8) == 2


@pytest.mark.parametrize("context", [0, 17], ids=["empty", "past-the-static-buffer"])
def test_a_context_the_cache_cannot_hold_is_an_input_error(static, context):
    with pytest.raises(InputError, match=rf"context={context} for the KV cache of "
                                         r"LlamaForCausalLM: it holds 1 \.\. 16 tokens"):
        static.kv_cache_bytes(context)


def test_a_sliding_layer_holds_its_window_and_a_full_layer_every_token():
    from tests.generation.test_generation_sliding import SIZES, W, _generate

    # Qwen2 with layer 0 full and layer 1 sliding (window W = 6), batch 1: at 11 tokens the
    # step attends 11 entries in layer 0 and W in layer 1, keys and values of 2 x 8 float32.
    mixed = _generate(transformers.Qwen2Config(use_sliding_window=True, sliding_window=W,
                                               max_window_layers=1, **SIZES))
    entry = 2 * 2 * 8 * 4
    assert mixed.kv_cache_bytes(11) == (11 + W) * entry
    assert mixed.kv_cache_bytes(3) == (3 + 3) * entry  # below the window both hold them all
