"""A transformers causal LM called as it comes (``use_cache`` left at its config's True) is
counted as the same call with ``use_cache=False``: forward and train, the same totals and the
same per-operator counts, with a note saying so; nothing registered with torch's pytree after."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.torch_internals import pytree

transformers = pytest.importorskip("transformers")

#: Tiny configs: 2 layers of width 32, 4 heads (2 key-value heads where the family has them).
_MODELS = {
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=0, eos_token_id=0)),
}


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("family", list(_MODELS))
def test_a_causal_lm_as_it_comes_counts_as_without_its_cache(family, mode):
    torch.manual_seed(0)
    model = _MODELS[family]().eval()
    ids = torch.randint(0, 128, (1, 8))
    assert model.config.use_cache  # the default the user gets
    registered = set(pytree.SUPPORTED_NODES)

    as_it_comes = exportflops.analyze(model, (ids,), mode=mode)
    without = exportflops.analyze(model, (ids,), {"use_cache": False}, mode=mode)

    assert as_it_comes.total == without.total
    assert as_it_comes.operators == without.operators
    assert as_it_comes.capture == without.capture == "export"
    assert any("use_cache=False" in note for note in as_it_comes.capture_notes)
    assert without.capture_notes == []  # the user's own call: nothing changed
    assert model.config.use_cache  # the model is as it was
    assert set(pytree.SUPPORTED_NODES) == registered  # no cache class left registered


def test_a_call_that_asks_for_the_cache_is_left_as_given():
    """``use_cache=True`` given explicitly is the user's call: not rewritten. torch.export cannot
    return its DynamicCache, so it is counted from an eager run, which builds the cache."""
    torch.manual_seed(0)
    model = _MODELS["llama"]().eval()
    ids = torch.randint(0, 128, (1, 8))
    report = exportflops.analyze(model, (ids,), {"use_cache": True})
    without = exportflops.analyze(model, (ids,), {"use_cache": False})
    assert report.capture == "eager"
    assert not any("use_cache=False" in note for note in report.capture_notes)
    # The cache's build: one concatenation of keys and one of values per layer (2 layers);
    # it changes no contraction.
    cats = report.operators["aten.cat.default"].calls - without.operators["aten.cat.default"].calls
    assert cats == 2 * 2
    assert report.total.macs == without.total.macs


@pytest.mark.parametrize("by", ["name", "position"])
def test_dynamic_shapes_given_for_the_call_as_it_comes_still_fit_it(by):
    """The ``use_cache`` added is an input torch.export matches ``dynamic_shapes`` against: it
    gets its entry (none), by name or in order, and the counts stay expressions of ``seq``."""
    torch.manual_seed(0)
    model = _MODELS["llama"]().eval()
    ids = torch.randint(0, 128, (1, 8))
    seq = torch.export.Dim("seq", min=2, max=64)
    shapes = {"input_ids": {1: seq}} if by == "name" else ({1: seq},)
    given = {"input_ids": {1: seq}, "use_cache": None} if by == "name" else ({1: seq}, None)

    as_it_comes = exportflops.analyze(model, (ids,), dynamic_shapes=shapes)
    without = exportflops.analyze(model, (ids,), {"use_cache": False}, dynamic_shapes=given)

    assert [s.name for s in as_it_comes.symbols] == ["seq"]
    assert as_it_comes.symbols == without.symbols
    assert not isinstance(as_it_comes.total.flops, int)  # an expression of seq
    assert as_it_comes.total == without.total


def test_profile_times_a_transformers_model_as_it_comes_as_analyze_counts_it():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros(1, 6, dtype=torch.long)
    timed = exportflops.profile(model, (ids,), warmup=1, repeat=2)
    counted = exportflops.analyze(model, (ids,))
    assert timed.total == counted.total and timed.capture_notes == counted.capture_notes
    assert timed.runtime is not None and config.use_cache
