"""The prefill as transformers' ``generate`` runs it (the LM head on the last prompt position,
``logits_to_keep=1``) and the full-logits prefill as an option; a request the model cannot run
(past a learned position table, a static cache too short) refused with an `InputError`, also by
the command (issue 36, items 1 and 2). Every count is derived by hand below."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exportflops import analyze, analyze_generation  # noqa: E402
from exportflops.cli import main  # noqa: E402
from exportflops.errors import GenerationError, InputError  # noqa: E402
from exportflops.examples.llama import LlamaConfig, llama  # noqa: E402
from exportflops.generation.cache_names import cache_argument  # noqa: E402
from exportflops.generation.decoder import dynamic_cache_pytree  # noqa: E402
# The same tiny Llama and prompt as the generation tests.
from tests.generation.test_generation import _llama as _hf_llama  # noqa: E402

# A tiny Llama: 2 layers, width 32, 4 query heads and 2 key/value heads of dim 8 (GQA), SwiGLU
# of width 48, a 64-token vocabulary, untied head; 2 prompts of 5 tokens.
LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2, 32, 4, 2, 8, 48, 64
BATCH, PROMPT, NEW = 2, 5, 4

# MACs per token of one layer: q and o (WIDTH x WIDTH), k and v (WIDTH x KV_HEADS * HEAD_DIM),
# gate, up and down (WIDTH x FFN).
LAYER_PER_TOKEN = 2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD_DIM + 3 * WIDTH * FFN  # 7680
# The prefill's attention per layer and sequence: q.k and p.v, HEADS x HEAD_DIM MACs for each
# of the PROMPT x PROMPT (query, key) pairs (the causal mask's half included, as executed).
ATTENTION = 2 * HEADS * HEAD_DIM * PROMPT * PROMPT  # 1600
LAYERS_MACS = BATCH * LAYERS * (PROMPT * LAYER_PER_TOKEN + ATTENTION)  # 2 * 2 * 40000 = 160000
HEAD_ONCE = BATCH * WIDTH * VOCAB  # the LM head on one position per sequence: 4096
# The head on the other PROMPT - 1 positions of each prompt, what full logits add.
HEAD_REST = BATCH * (PROMPT - 1) * WIDTH * VOCAB  # 2 * 4 * 32 * 64 = 16384


@pytest.fixture(scope="module")
def model():
    return _hf_llama()


@pytest.fixture(scope="module")
def prompt():
    return torch.zeros(BATCH, PROMPT, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def kept(model, prompt):
    return analyze_generation(model, prompt, new_tokens=NEW)


@pytest.fixture(scope="module")
def full(model, prompt):
    return analyze_generation(model, prompt, new_tokens=NEW, full_logits=True)


def test_the_prefill_runs_the_head_once_per_sequence_as_generate_does(kept):
    assert kept.prefill_logit_positions == 1
    assert kept.prefill.total.macs == LAYERS_MACS + HEAD_ONCE  # 160000 + 4096
    assert kept.prefill.module("lm_head").inclusive.macs == HEAD_ONCE


def test_full_logits_adds_the_head_on_the_other_prompt_positions(kept, full):
    assert full.prefill_logit_positions == PROMPT
    assert full.prefill.total.macs == LAYERS_MACS + HEAD_ONCE + HEAD_REST  # 164096 + 16384
    assert full.prefill.module("lm_head").inclusive.macs == BATCH * PROMPT * WIDTH * VOCAB
    # The decode steps read one token each: their head is the same either way.
    assert full.decode == kept.decode
    assert full.total.macs - kept.total.macs == HEAD_REST


def test_full_logits_is_the_plain_forward_over_the_prompt(model, prompt, full):
    # The count before logits_to_keep: the model called on the prompt as it comes.
    with dynamic_cache_pytree():
        forward = analyze(model, (), {"input_ids": prompt, "use_cache": True,
                                      cache_argument(model): transformers.DynamicCache(
                                          config=model.config)})
    assert full.prefill.total == forward.total


def test_generate_passes_logits_to_keep_1_to_this_model(model):
    # What the counted convention rests on, read from transformers itself: generate keeps the
    # last logits of a model whose forward takes the keyword.
    assert model._supports_logits_to_keep()


def test_a_static_cache_prefill_keeps_the_last_logits_too(model, prompt):
    kept = analyze_generation(model, prompt, new_tokens=NEW, cache="static")
    full = analyze_generation(model, prompt, new_tokens=NEW, cache="static", full_logits=True)
    assert (kept.prefill_logit_positions, full.prefill_logit_positions) == (1, PROMPT)
    assert full.prefill.total.macs - kept.prefill.total.macs == HEAD_REST
    # The wrapper's model is the one given, called without the keyword once analyzed.
    assert not model._forward_pre_hooks_with_kwargs and not model._forward_pre_hooks


def test_a_forward_without_logits_to_keep_computes_every_positions_logits(model, prompt, full):
    class EveryLogit(transformers.LlamaForCausalLM):
        """A causal LM whose forward takes no logits_to_keep: generate computes all logits."""

        def forward(self, input_ids=None, cache=None, use_cache=None, past_key_values=None):
            return super().forward(input_ids=input_ids, use_cache=use_cache,
                                   **{cache_argument(self): cache or past_key_values})

    with torch.device("meta"):
        every = EveryLogit(model.config).eval()
    report = analyze_generation(every, prompt, new_tokens=NEW)
    assert report.prefill_logit_positions == PROMPT
    assert report.prefill.total.macs == full.prefill.total.macs == LAYERS_MACS + HEAD_ONCE \
        + HEAD_REST


# The built-in Llama, the same sizes.
REFERENCE = LlamaConfig(vocab_size=VOCAB, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS,
                        n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, ffn_dim=FFN, max_seq_len=16)


@pytest.mark.parametrize("last_only", [True, False], ids=["logits-last-only", "as-meta-runs"])
def test_the_built_in_llama_prefill_computes_what_its_forward_does(last_only):
    model, (tokens,) = llama("meta", replace(REFERENCE, logits_last_only=last_only),
                             seq_len=PROMPT, batch=BATCH)
    report = analyze_generation(model, tokens, new_tokens=NEW)
    positions = 1 if last_only else PROMPT
    assert report.prefill_logit_positions == positions
    assert report.prefill.module("output").inclusive.macs == BATCH * positions * WIDTH * VOCAB
    assert report.prefill.total.macs == LAYERS_MACS + HEAD_ONCE + (0 if last_only else HEAD_REST)


def test_a_built_in_llama_without_full_logits_refuses_them():
    model, (tokens,) = llama("meta", replace(REFERENCE, logits_last_only=True), seq_len=PROMPT,
                             batch=BATCH)
    with pytest.raises(GenerationError, match="logits_last_only=False"):
        analyze_generation(model, tokens, new_tokens=NEW, full_logits=True)


# Requests past the positions a model holds.

def _gpt2(positions: int = 16, device: str = "meta"):
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=positions, bos_token_id=0, eos_token_id=0)
    with torch.device(device):
        return transformers.GPT2LMHeadModel(config).eval()


def _ids(length: int, device: str = "meta") -> torch.Tensor:
    return torch.zeros(1, length, dtype=torch.long, device=device)


@pytest.mark.parametrize(("prompt_len", "new_tokens", "message"), [
    (20, 1, r"a prompt of 20 tokens: they take positions 0 \.\. 19.*transformer\.wpe.*"
            r"config\.n_positions = 16\) holds positions 0 \.\. 15.*IndexError.*"
            r"Shorten the prompt to at most 16 tokens"),
    # 10 + 10 feed positions 0 .. 18; with 16 positions at most 16 - 10 + 1 = 7 new tokens.
    (10, 10, r"10 prompt tokens and 10 new tokens feed tokens at positions 0 \.\. 18.*"
             r"transformer\.wpe.*Generate at most 7 new tokens"),
    (10, 8, r"positions 0 \.\. 16.*Generate at most 7 new tokens"),
], ids=["prompt-too-long", "prompt-and-new-too-long", "one-past-the-table"])
def test_a_request_past_the_learned_position_table_is_refused(prompt_len, new_tokens, message):
    with pytest.raises(InputError, match=message):
        analyze_generation(_gpt2(), _ids(prompt_len), new_tokens=new_tokens)


def test_the_refused_limit_is_where_the_model_fails_on_cpu():
    # The limit derived: P + G - 1 positions <= 16. At it the model runs on cpu; one past it
    # the position lookup raises, as the refusal says.
    torch.manual_seed(0)
    model = _gpt2(device="cpu")

    def run(prompt_len: int, new_tokens: int) -> None:
        with torch.no_grad():
            out = model(_ids(prompt_len, "cpu"), use_cache=True)
            for _ in range(new_tokens - 1):
                out = model(_ids(1, "cpu"), use_cache=True,
                            **{cache_argument(model): getattr(out, cache_argument(model))})

    run(16, 1)
    run(10, 7)
    for prompt_len, new_tokens in ((17, 1), (10, 8)):
        with pytest.raises(IndexError):
            run(prompt_len, new_tokens)


def test_a_request_at_the_limit_is_counted():
    report = analyze_generation(_gpt2(), _ids(10), new_tokens=7)
    assert list(report.decode_positions) == list(range(10, 16))  # the last step feeds 15


def test_a_static_cache_too_short_is_refused():
    # 5 prompt tokens and 8 new ones need 5 + 8 - 1 = 12 entries.
    with pytest.raises(InputError, match=r"max_cache_len=11 cannot hold.*need 12 entries.*"
                                         r"max_cache_len >= 12"):
        analyze_generation(_hf_llama(), _ids(5), new_tokens=8, cache="static", max_cache_len=11)


def test_the_built_in_llama_refuses_a_request_past_max_seq_len():
    model, (tokens,) = llama("meta", REFERENCE, seq_len=10)
    with pytest.raises(InputError, match=r"max_seq_len = 16 holds positions 0 \.\. 15.*"
                                         r"Generate at most 7 new tokens"):
        analyze_generation(model, tokens, new_tokens=8)


def test_an_encoder_decoder_model_is_refused_per_table():
    # BART shifts positions by 2: its tables have max_position_embeddings + 2 = 18 rows.
    config = transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=16)
    with torch.device("meta"):
        model = transformers.BartForConditionalGeneration(config).eval()
    with pytest.raises(InputError, match=r"prompt of 17 tokens.*model\.encoder\.embed_positions "
                                         r"\(an nn\.Embedding of 18 rows, less the offset 2"):
        analyze_generation(model, _ids(17), new_tokens=2)
    # The decoder: its start token and G - 1 steps take positions 0 .. G - 1.
    with pytest.raises(InputError, match=r"cannot generate 17 tokens.*"
                                         r"model\.decoder\.embed_positions.*at most 16 new"):
        analyze_generation(model, _ids(4), new_tokens=17)


# The command.

@pytest.fixture()
def factories(tmp_path):
    module = tmp_path / "tiny_generators.py"
    module.write_text(
        "import transformers\n"
        "def gpt2():\n"
        "    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, "
        "n_positions=16, bos_token_id=0, eos_token_id=0)\n"
        "    return transformers.GPT2LMHeadModel(config).eval()\n"
        "def llama():\n"
        f"    config = transformers.LlamaConfig(vocab_size={VOCAB}, hidden_size={WIDTH}, "
        f"intermediate_size={FFN}, num_hidden_layers={LAYERS}, num_attention_heads={HEADS}, "
        f"num_key_value_heads={KV_HEADS}, tie_word_embeddings=False)\n"
        "    return transformers.LlamaForCausalLM(config).eval()\n")
    return str(module)


@pytest.mark.parametrize(("args", "message"), [
    (["gpt2", "--input", "1,20:int64", "--generate", "2"],
     "cannot read a prompt of 20 tokens"),
    (["gpt2", "--input", "1,10:int64", "--generate", "10"], "Generate at most 7 new tokens"),
    (["llama", "--input", "1,5:int64", "--generate", "8", "--cache", "static",
      "--max-cache-len", "11"], "--max-cache-len 11 cannot hold"),
], ids=["prompt-too-long", "prompt-and-new-too-long", "static-cache-too-short"])
def test_the_command_prints_the_refusal_and_exits_2(factories, capsys, args, message):
    assert main([f"{factories}:{args[0]}", *args[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and "does not take" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_command_counts_full_logits_when_asked(factories, capsys):
    spec = f"{factories}:llama"
    for flags, positions in (([], 1), (["--full-logits"], PROMPT)):
        assert main([spec, "--input", f"{BATCH},{PROMPT}:int64", "--generate", str(NEW),
                     "--format", "json", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prefill_logit_positions"] == positions
        assert report["prefill"]["total"]["macs"] == LAYERS_MACS + HEAD_ONCE \
            + (positions - 1) * BATCH * WIDTH * VOCAB


def test_full_logits_without_generate_is_a_usage_error(factories, capsys):
    assert main([f"{factories}:llama", "--input", "1,5:int64", "--full-logits"]) == 2
    assert "--full-logits counts the prefill of a generation: it needs --generate N" in \
        capsys.readouterr().err
