"""Each transformers type a pipeline with tp or fsdp splits into stages of its own modules
(`exportflops.parallel.pipeline.decoder_stage.DECODERS`) runs, stage after stage, as the
model runs: on a tiny random config, the logits of the stages in sequence are the model's own
(``model(tokens).logits``), in training, so that a step the stages miss or add (a mask kind,
an embedding scale or dropout, a logit scale or cap) changes them."""

from __future__ import annotations

import warnings

import pytest
import torch

from exportflops.errors import LayoutError
from exportflops.parallel import Layout
from exportflops.parallel.pipeline.decoder_stage import MODELLED, decoder_stages

transformers = pytest.importorskip("transformers")

SEQ, WINDOW = 16, 4  # a sliding window shorter than the sequence: its mask is not causal's
#: One tiny config for every type; each type reads the fields it has and ignores the others.
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    # both mask kinds, where the type has sliding-window layers or windows every layer
    sliding_window=WINDOW, use_sliding_window=True,
    layer_types=["sliding_attention", "full_attention"] * 2,
    # the steps beside Llama's, set away from the identity so that a missed one shows:
    # Granite's embedding multiplier and logit divisor, Starcoder2's embedding dropout,
    # Cohere's logit scale, Gemma 2's logit cap (small: tiny random logits are small)
    embedding_multiplier=3.0, logits_scaling=5.0, embedding_dropout=0.5, logit_scale=0.5,
    final_logit_softcapping=0.5)


def _tiny(kind: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny config's defaults (rope lengths)
        config = transformers.AutoConfig.for_model(kind, **TINY)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


@pytest.mark.parametrize("kind", MODELLED)
def test_the_stages_in_sequence_give_the_models_logits(kind):
    model = _tiny(kind)
    tokens = torch.randint(3, TINY["vocab_size"], (2, SEQ),
                           generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # the same dropout draws, in the same order, on both runs
    expected = model(tokens).logits
    # One layer per stage: each makes its layer's mask, stage 0 sends the rotary tables.
    stages = [stage.module for stage in
              decoder_stages(model, tokens, 4, "forward", layout=Layout(pp=4, tp=2))]
    torch.manual_seed(2)
    hidden, cos, sin = stages[0](tokens)
    for stage in stages[1:-1]:
        hidden = stage(hidden, cos, sin)
    torch.testing.assert_close(stages[-1](hidden, cos, sin), expected)


def test_a_sliding_window_layer_is_not_run_on_the_causal_mask():
    # The check above can fail: the model on every layer causal gives other logits.
    model = _tiny("qwen2")
    tokens = torch.arange(3, 3 + SEQ).unsqueeze(0)
    model.config.layer_types = ["full_attention"] * 4
    causal = model(tokens).logits
    model.config.layer_types = TINY["layer_types"]
    assert not torch.allclose(model(tokens).logits, causal)


@pytest.mark.parametrize("kind", ["gemma3_text", "olmo3"])
def test_a_type_with_rotary_tables_per_layer_kind_is_refused_by_name(kind):
    model = _tiny(kind)
    with pytest.raises(LayoutError, match=rf"\(model_type '{kind}'\) is not modelled yet"):
        decoder_stages(model, torch.zeros(1, SEQ, dtype=torch.long), 2, "forward",
                       layout=Layout(pp=2, tp=2))


def test_a_layer_on_a_mask_kind_the_stage_does_not_make_is_refused_by_name():
    model = _tiny("qwen2")
    model.config.layer_types = ["full_attention", "chunked_attention"] * 2
    with pytest.raises(LayoutError, match="Qwen2ForCausalLM's config.layer_types hold "
                                          "chunked_attention"):
        decoder_stages(model, torch.zeros(1, SEQ, dtype=torch.long), 2, "forward",
                       layout=Layout(pp=2, tp=2))
