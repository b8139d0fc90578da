"""analyze_generation on an encoder-decoder model (a tiny T5): the encoder once in the prefill,
the decoder per token with its self-attention cache as ``past``, derived by hand."""

from __future__ import annotations

import pytest
import sympy
import torch

transformers = pytest.importorskip("transformers")

from exportflops import GenerationReport, analyze_generation, flops_report  # noqa: E402
from exportflops.records.symbolic import size_symbol  # noqa: E402
from exportflops.errors import GenerationError  # noqa: E402

# T5: width 32, 4 heads of dim 8, ReLU FFN of width 48, 3 encoder and 2 decoder layers, a
# 64-token vocabulary, untied head (T5 1.1 style); float32.
LAYERS, WIDTH, HEADS, HEAD_DIM, FFN, VOCAB, ITEMSIZE = 2, 32, 4, 8, 48, 64, 4
BATCH, PROMPT, NEW = 2, 5, 4
PAST = size_symbol("past")


@pytest.fixture(scope="module")
def report():
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=WIDTH, d_kv=HEAD_DIM, d_ff=FFN, num_layers=3,
        num_decoder_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0,
        tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(config).eval()
    return analyze_generation(model, torch.zeros(BATCH, PROMPT, dtype=torch.long,
                                                 device="meta"), new_tokens=NEW)


def test_decoder_step_macs_are_the_hand_polynomial_of_past(report):
    # Per token and decoder layer: self-attention q, k, v, o (WIDTH x WIDTH each); cross-
    # attention q and o only (the encoder's keys and values are cached); wi, wo (WIDTH x FFN).
    # Then the head (WIDTH x VOCAB). Attention: q.k and p.v over past + 1 own keys and over
    # the PROMPT encoder keys, HEADS x HEAD_DIM MACs per key each.
    per_token = LAYERS * (4 * WIDTH * WIDTH + 2 * WIDTH * WIDTH + 2 * WIDTH * FFN) + WIDTH * VOCAB
    attention = LAYERS * 2 * HEADS * HEAD_DIM * ((PAST + 1) + PROMPT)
    expected = BATCH * (per_token + attention)  # 256 * past + 42496
    assert sympy.Poly(report.decode.total.macs, PAST).all_coeffs() == \
        sympy.Poly(expected, PAST).all_coeffs()
    assert [s.name for s in report.decode.symbols] == ["past"] and report.decode.uncounted == []


def test_kv_cache_bytes_and_no_copy_of_either_cache(report):
    row = BATCH * HEADS * HEAD_DIM * ITEMSIZE  # one entry of one layer's keys: 256 bytes
    # Self-attention: past + 1 entries read, one written, keys and values per layer; cross-
    # attention: the encoder's PROMPT entries read whole, the same at every step.
    assert sympy.expand(report.kv_cache.bytes_read
                        - LAYERS * 2 * row * (PAST + 1 + PROMPT)) == 0
    assert report.kv_cache.bytes_written == LAYERS * 2 * row
    # Both caches are rebuilt from their tensors at the exported step's start: LAYERS x 2
    # copies each, left out. Each self-attention cache tensor is then read by one node, the
    # cache update in SelfAttention.
    assert len(report.dropped_nodes) == 2 * LAYERS * 2
    shape = [BATCH, HEADS, "past", HEAD_DIM]
    readers = [n for n in report.decode.nodes
               if n.cost.bytes_read != 0 and shape in [i.shape for i in n.inputs]]
    assert len(readers) == LAYERS * 2
    assert all(n.op == "aten.cat.default" and n.module.endswith("SelfAttention")
               for n in readers)


def test_steps_run_at_the_decoder_cache_lengths_and_sum_in_closed_form(report):
    # The prefill runs the encoder and the decoder's start token: the first generated token.
    # The decoder cache then holds 1, 2, 3 tokens at the G - 1 = 3 decode steps.
    assert list(report.decode_positions) == [1, 2, 3] and report.first_past == 1
    looped = report.prefill.total
    for past in (1, 2, 3):
        looped = looped + report.step_counts(past)
    assert report.total == looped
    assert GenerationReport.model_validate_json(report.model_dump_json()) == report


def test_the_prefill_runs_the_encoder_once(report):
    encoder = [n for n in report.prefill.nodes if ".encoder." in f".{n.module}."]
    decoder = [n for n in report.decode.nodes if ".encoder." in f".{n.module}."]
    assert encoder and not decoder


def test_a_static_cache_is_a_typed_error():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=WIDTH, d_kv=HEAD_DIM, d_ff=FFN,
                                   num_layers=1, num_heads=HEADS)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(config).eval()
    with pytest.raises(GenerationError, match="cache='dynamic'"):
        analyze_generation(model, torch.zeros(1, 3, dtype=torch.long, device="meta"),
                           new_tokens=2, cache="static")


def test_the_table_counts_the_encoder_and_decoder_tokens(report):
    lines = flops_report(report, as_string=False).splitlines()
    # Prefill: PROMPT encoder tokens and the start token per sequence; then G - 1 = 3 steps.
    prefill = next(line for line in lines if line.startswith("prefill")).split()
    assert int(prefill[1]) == BATCH * (PROMPT + 1)
    request = next(line for line in lines if line.startswith("request")).split()
    assert int(request[1]) == BATCH * (PROMPT + 1 + NEW - 1)
    assert any(line.startswith("decode, past=1 ") for line in lines)


def _whisper(encoder_positions: int):
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=WIDTH, encoder_layers=1, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN, num_mel_bins=8, max_source_positions=encoder_positions,
        max_target_positions=32, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=0)
    with torch.device("meta"):
        return transformers.WhisperForConditionalGeneration(config).eval()


def test_whisper_takes_its_features_and_its_decoder_step_is_the_hand_polynomial():
    # Whisper's encoder reads 8 mel bins x 32 frames; its two stride-1/stride-2 convolutions
    # leave 16 positions (max_source_positions), the length the decoder's cross-attention reads.
    encoded = 16
    report = analyze_generation(_whisper(encoded), torch.zeros(BATCH, 8, 2 * encoded,
                                                               device="meta"), new_tokens=NEW)
    assert report.prompt_len == encoded and report.first_past == 1
    # Per token and decoder layer as T5's above (self q, k, v, o; cross q, o; fc1, fc2 of
    # width FFN), then proj_out (WIDTH x VOCAB); attention over past + 1 own keys and the 16
    # encoder positions, HEADS x HEAD_DIM = WIDTH MACs per key for q.k and again for p.v.
    per_token = LAYERS * (6 * WIDTH * WIDTH + 2 * WIDTH * FFN) + WIDTH * VOCAB
    attention = LAYERS * 2 * WIDTH * ((PAST + 1) + encoded)
    expected = BATCH * (per_token + attention)  # 256 * past + 45312
    assert sympy.Poly(report.decode.total.macs, PAST).all_coeffs() == \
        sympy.Poly(expected, PAST).all_coeffs()
    assert report.decode.uncounted == [] and report.prefill.uncounted == []
    encoder = [n for n in report.prefill.nodes if ".encoder." in f".{n.module}."]
    assert encoder and not [n for n in report.decode.nodes if ".encoder." in f".{n.module}."]


def test_features_of_the_wrong_kind_are_a_typed_error():
    model = _whisper(16)
    with pytest.raises(ValueError, match="input_features"):  # token ids instead of features
        analyze_generation(model, torch.zeros(1, 3, dtype=torch.long, device="meta"),
                           new_tokens=2)
    with pytest.raises(ValueError, match="rejects input_features"):  # 20 frames, not 32
        analyze_generation(model, torch.zeros(1, 8, 20, device="meta"), new_tokens=2)
