"""analyze_generation on the built-in Llama (Meta's reference, its KV cache passed in and
returned): the decode step's MACs and bytes derived by hand as polynomials of the cache length."""

from __future__ import annotations

import pytest
import sympy
import torch

from exportflops import analyze, analyze_generation
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.records.symbolic import size_symbol
from exportflops.errors import GenerationError

# 2 layers, width 32, 4 query heads and 2 key/value heads of dim 8 (GQA), SwiGLU of width 48,
# a 64-token vocabulary, untied output; float32.
LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, ITEMSIZE = 2, 32, 4, 2, 8, 48, 64, 4
BATCH, PROMPT, NEW = 2, 5, 4
CONFIG = LlamaConfig(vocab_size=VOCAB, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS,
                     n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, ffn_dim=FFN, max_seq_len=64)
PAST = size_symbol("past")
ROW = BATCH * KV_HEADS * HEAD_DIM * ITEMSIZE  # one cache entry of one layer's keys: 128 bytes


@pytest.fixture(scope="module")
def report():
    model, (tokens,) = llama("meta", CONFIG, seq_len=PROMPT, batch=BATCH)
    return analyze_generation(model, tokens, new_tokens=NEW)


def test_decode_step_macs_and_bytes_by_hand(report):
    # Per token: wq, wo (WIDTH x WIDTH), wk, wv (WIDTH x KV_HEADS*HEAD_DIM), w1, w3, w2
    # (WIDTH x FFN) per layer, and the output (WIDTH x VOCAB); q.k and p.v over past + 1 keys.
    per_token = LAYERS * (2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD_DIM + 3 * WIDTH * FFN)
    attention = LAYERS * 2 * HEADS * HEAD_DIM * (PAST + 1)
    expected = BATCH * (per_token + WIDTH * VOCAB + attention)
    assert sympy.Poly(report.decode.total.macs, PAST).all_coeffs() == \
        sympy.Poly(expected, PAST).all_coeffs()
    assert [s.name for s in report.decode.symbols] == ["past"]
    # Per cached token and layer: the cache update (torch.cat) reads the past keys and values,
    # 2 x ROW, and writes them again; the reference's repeat expands keys and values to the
    # query heads and reshapes them, a copy (the expanded view cannot be viewed at HEADS) that
    # reads the stored 2 x ROW and writes 2 x QROW; the attention reads those copies, 2 x QROW;
    # no mask (one query sees every key). Nothing else touches the cache.
    qrow = BATCH * HEADS * HEAD_DIM * ITEMSIZE  # 256
    read = LAYERS * (2 * ROW + 2 * ROW + 2 * qrow)  # 2 * (256 + 256 + 512)
    assert sympy.Poly(report.decode.total.bytes_read, PAST).coeff_monomial(PAST) == read
    assert sympy.Poly(report.decode.total.bytes_written, PAST).coeff_monomial(PAST) == \
        LAYERS * (2 * ROW + 2 * qrow)
    # The KV cache part: keys and values of KV_HEADS heads, past + 1 entries read, one written.
    assert sympy.expand(report.kv_cache.bytes_read - LAYERS * 2 * ROW * (PAST + 1)) == 0
    assert report.kv_cache.bytes_written == LAYERS * 2 * ROW and report.dropped_nodes == []


@pytest.mark.parametrize("past", [3, 17])
def test_the_polynomial_equals_a_concrete_step(report, past):
    model, _ = llama("meta", CONFIG, seq_len=PROMPT, batch=BATCH)
    shape = (BATCH, KV_HEADS, past, HEAD_DIM)
    cache = [(torch.zeros(shape, device="meta"), torch.zeros(shape, device="meta"))
             for _ in range(LAYERS)]
    token = torch.zeros(BATCH, 1, dtype=torch.long, device="meta")
    assert report.step_counts(past) == analyze(model, (token, cache)).total


def test_request_total_is_the_prefill_plus_each_step(report):
    looped = report.prefill.total
    for past in range(PROMPT, PROMPT + NEW - 1):
        looped = looped + report.step_counts(past)
    assert report.total == looped


def test_the_cached_steps_compute_what_the_full_forward_does():
    torch.manual_seed(0)
    model, _ = llama("cpu", CONFIG, seq_len=PROMPT, batch=BATCH)
    tokens = torch.randint(0, VOCAB, (BATCH, PROMPT + 2))
    full = model(tokens)
    logits, cache = model(tokens[:, :PROMPT], [])
    torch.testing.assert_close(logits, full[:, :PROMPT])
    for position in (PROMPT, PROMPT + 1):
        logits, cache = model(tokens[:, position:position + 1], cache)
        torch.testing.assert_close(logits[:, 0], full[:, position])
    # Two new tokens at once after a cache: the mask lets each see the cache and its past.
    _, cache = model(tokens[:, :3], [])
    logits, _ = model(tokens[:, 3:PROMPT + 2], cache)
    torch.testing.assert_close(logits, full[:, 3:])


def test_a_static_cache_is_a_typed_error():
    model, (tokens,) = llama("meta", CONFIG, seq_len=PROMPT, batch=BATCH)
    with pytest.raises(GenerationError, match="cache='dynamic'"):
        analyze_generation(model, tokens, new_tokens=2, cache="static")
