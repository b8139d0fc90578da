"""analyze_generation reads the cache's layout from the model (a one-token prefill): multi-query
attention caches one key/value head, whatever the config's head counts say; a model whose cache
is not keys and values (a state-space model) is a typed error."""

from __future__ import annotations

import pytest
import sympy
import torch

transformers = pytest.importorskip("transformers")

from exportflops import analyze_generation  # noqa: E402
from exportflops.records.symbolic import size_symbol  # noqa: E402
from exportflops.errors import GenerationError  # noqa: E402

PAST = size_symbol("past")
PROMPT = torch.zeros(1, 4, dtype=torch.long, device="meta")


def _meta(config):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_falcon_multi_query_caches_one_head():
    # Falcon-7B's layout, shrunk: 2 layers, width 32, 4 query heads of dim 8, one key/value head
    # (multi_query); float32. Per step and layer: keys and values, 1 head x 8 x 4 bytes per
    # entry, past + 1 entries read, one written. Attention: q.k and p.v over past + 1 keys,
    # 4 heads x 8 MACs per key each.
    config = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, multi_query=True,
                                       new_decoder_architecture=False, alibi=False)
    report = analyze_generation(_meta(config), PROMPT, new_tokens=3)
    assert sympy.expand(report.kv_cache.bytes_read - 2 * 2 * 8 * 4 * (PAST + 1)) == 0
    assert report.kv_cache.bytes_written == 2 * 2 * 8 * 4
    per_key = sympy.Poly(report.decode.total.macs, PAST).all_coeffs()[0]
    assert per_key == 2 * 2 * 4 * 8


def test_a_state_space_model_is_a_typed_error():
    config = transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=4,
                                      num_hidden_layers=2)
    with pytest.raises(GenerationError, match="LinearAttentionLayer"):
        analyze_generation(_meta(config), PROMPT, new_tokens=3)


def test_layers_the_model_does_not_tie_share_one_past():
    # BERT as a decoder reads the cache length of its first layer only, so torch keeps each
    # layer's length a size of its own; every layer's cache holds `past` entries all the same.
    # 2 layers, width 32 (4 heads of dim 8): q.k and p.v over past + 1 keys, 32 MACs per key
    # each, per layer.
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     is_decoder=True)
    report = analyze_generation(_meta(config), PROMPT, new_tokens=3)
    assert [s.name for s in report.decode.symbols] == ["past"]
    assert sympy.Poly(report.decode.total.macs, PAST).all_coeffs()[0] == 2 * 2 * 32
    assert isinstance(report.total.macs, int)


def test_a_data_dependent_size_stays_a_symbol_of_the_request_total():
    from exportflops.records.generation import power_sum

    routed = sympy.Symbol("u0", integer=True, nonnegative=True)
    # (3 past + 2 u0) over past = 1 .. 4: 3 x (1 + 2 + 3 + 4) + 4 x 2 u0.
    assert sympy.expand(power_sum(3 * PAST + 2 * routed, PAST, 1, 4) - (30 + 8 * routed)) == 0
    assert power_sum(3 * PAST + 2, PAST, 1, 4) == 38
