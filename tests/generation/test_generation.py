"""analyze_generation: a decode step as a polynomial of the cache length, derived by hand for a
tiny Llama-shaped decoder (GQA, SwiGLU, untied head), and the request total in closed form."""

from __future__ import annotations

import pytest
import sympy
import torch

transformers = pytest.importorskip("transformers")

import exportflops  # noqa: E402
from exportflops import GenerationReport, analyze, analyze_generation  # noqa: E402
from exportflops.generation.cache_names import cache_argument  # noqa: E402
from exportflops.generation.decoder import dynamic_cache_pytree  # noqa: E402
from exportflops.records.symbolic import size_symbol  # noqa: E402
from exportflops.errors import GenerationError, InputError  # noqa: E402

# A tiny Llama: 2 layers, width 32, 4 query heads and 2 key/value heads of dim 8 (GQA), SwiGLU
# MLP of width 48, a 64-token vocabulary, untied head; float32 (4 bytes).
LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, ITEMSIZE = 2, 32, 4, 2, 8, 48, 64, 4
BATCH, PROMPT, NEW = 2, 5, 4
PAST = size_symbol("past")


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return _llama()


@pytest.fixture(scope="module")
def prompt():
    return torch.zeros(BATCH, PROMPT, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def dynamic(model, prompt):
    return analyze_generation(model, prompt, new_tokens=NEW)


@pytest.fixture(scope="module")
def static(model, prompt):
    return analyze_generation(model, prompt, new_tokens=NEW, cache="static", max_cache_len=16)


# MACs per token that do not depend on the context: per layer the q and o projections
# (WIDTH x WIDTH each), k and v (WIDTH x KV_HEADS*HEAD_DIM each), the SwiGLU gate, up and
# down (WIDTH x FFN each); then the LM head (WIDTH x VOCAB).
PROJECTIONS = 2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD_DIM  # 2048 + 1024
MLP = 3 * WIDTH * FFN  # 4608
HEAD = WIDTH * VOCAB  # 2048
CONSTANT_MACS = BATCH * (LAYERS * (PROJECTIONS + MLP) + HEAD)  # 2 * (2 * 7680 + 2048)


def attention_macs(keys):
    """q.k and p.v per layer: HEADS x HEAD_DIM MACs per key each, for one query per sequence."""
    return BATCH * LAYERS * 2 * HEADS * HEAD_DIM * keys


def test_decode_step_matmul_macs_are_the_hand_polynomial_of_past(dynamic):
    # The step attends over past + 1 keys: the cached ones and its own.
    expected = CONSTANT_MACS + attention_macs(PAST + 1)
    graph = sympy.Poly(dynamic.decode.total.macs, PAST)
    assert graph.all_coeffs() == sympy.Poly(expected, PAST).all_coeffs()
    assert [s.name for s in dynamic.decode.symbols] == ["past"]
    # matmul FLOPs: 2 per MAC, so q.k and p.v are 2 x HEADS x HEAD_DIM x (past + 1) each.
    assert sympy.expand(dynamic.decode.total.matmul_flops - 2 * expected) == 0


def test_kv_cache_bytes_are_read_with_the_key_value_heads(dynamic):
    # Per sequence and layer, keys and values: KV_HEADS x HEAD_DIM x (past + 1) entries read
    # (the past and the step's own), one entry written.
    row = BATCH * LAYERS * 2 * KV_HEADS * HEAD_DIM * ITEMSIZE
    assert sympy.expand(dynamic.kv_cache.bytes_read - row * (PAST + 1)) == 0
    assert dynamic.kv_cache.bytes_written == row
    with_query_heads = BATCH * LAYERS * 2 * HEADS * HEAD_DIM * ITEMSIZE * (PAST + 1)
    assert sympy.expand(dynamic.kv_cache.bytes_read - with_query_heads) != 0
    # They are in the step's own bytes: the cache updates (a concatenation of the past entries
    # and the new one, one per layer for keys and one for values) read exactly those entries.
    cats = [n for n in dynamic.decode.nodes if n.op == "aten.cat.default"
            and n.outputs[0].shape[2:3] == ["past + 1"]]
    assert len(cats) == LAYERS * 2 and all(n.module.endswith("self_attn") for n in cats)
    assert sympy.expand(sum(n.cost.bytes_read for n in cats) - row * (PAST + 1)) == 0


# One cache entry of one layer's keys (or values) for the whole batch, in bytes.
ROW = BATCH * KV_HEADS * HEAD_DIM * ITEMSIZE  # 2 * 2 * 8 * 4 = 128


@pytest.mark.parametrize("past", [2, 9, 33], ids=lambda p: f"past={p}")
def test_the_polynomial_equals_a_concrete_decode_step(model, dynamic, past):
    shape = (BATCH, KV_HEADS, past, HEAD_DIM)
    layers = [(torch.zeros(shape, device="meta"), torch.zeros(shape, device="meta"))
              for _ in range(LAYERS)]
    with dynamic_cache_pytree():
        concrete = analyze(model, (), {
            "input_ids": torch.zeros(BATCH, 1, dtype=torch.long, device="meta"),
            cache_argument(model): (cache := transformers.DynamicCache(layers)),
            "use_cache": True})
    # Analyzed as a plain call, the step starts by rebuilding the DynamicCache from the given
    # tensors: one copy of each of the LAYERS x 2 cache tensors (past entries read, written),
    # which the generation report leaves out (a decode loop keeps its cache).
    assert all(layer.keys.shape[2] == past for layer in cache.layers)  # left as it was
    rebuild = [n for n in concrete.nodes if n.op == "aten.cat.default"
               and n.outputs[0].shape == list(shape)]
    assert len(rebuild) == LAYERS * 2 and len(dynamic.dropped_nodes) == LAYERS * 2
    copy = LAYERS * 2 * ROW * past
    expected = concrete.total - exportflops.Cost(bytes_read=copy, bytes_written=copy)
    assert dynamic.step(past).total == expected
    assert dynamic.step_counts(past) == expected


def test_no_node_of_the_decode_step_copies_the_past_cache_twice(dynamic):
    # The cache tensors (batch, kv_heads, past, head_dim) are read by one node each: the
    # attention's cache update (a cat of the past entries and the new one) in self_attn. (A
    # sym_size reads their length, not their bytes.)
    cache_shape = [BATCH, KV_HEADS, "past", HEAD_DIM]
    readers = [n for n in dynamic.decode.nodes if n.cost.bytes_read != 0
               and cache_shape in [i.shape for i in n.inputs]]
    assert len(readers) == LAYERS * 2
    assert all(n.op == "aten.cat.default" and n.module.endswith("self_attn") for n in readers)


def test_decode_step_bytes_by_hand(dynamic):
    total = dynamic.decode.total
    # Bytes read per cached token, from the graph's ops:
    # - the mask, once at the model's root: the key positions (int64) shifted by an add
    #   (8 bytes read) and compared by a le (8 bytes read);
    # - per layer, the cache update reads the past keys and values: 2 x ROW;
    # - per layer, transformers' repeat_kv expands keys and values to the query heads and
    #   reshapes them: the expanded view cannot be viewed at HEADS, so the reshape copies,
    #   reading the stored KV_HEADS rows (2 x ROW) and writing HEADS rows (2 x QROW);
    # - per layer, the attention reads those copies, 2 x QROW, and the boolean mask, expanded
    #   over the batch (stride 0): its one stored byte.
    qrow = BATCH * HEADS * HEAD_DIM * ITEMSIZE  # 256
    read_per_token = 8 + 8 + LAYERS * (2 * ROW + 2 * ROW + 2 * qrow + 1)  # 16 + 2 * 1025
    # Written per cached token: the key positions by arange and by the add (int64, 8 bytes
    # each), the boolean mask (1), and per layer the updated keys and values (2 x ROW) and
    # repeat_kv's copies (2 x QROW).
    written_per_token = 8 + 8 + 1 + LAYERS * (2 * ROW + 2 * qrow)  # 17 + 2 * 768
    assert sympy.Poly(total.bytes_read, PAST).coeff_monomial(PAST) == read_per_token
    assert sympy.Poly(total.bytes_written, PAST).coeff_monomial(PAST) == written_per_token
    # Weights: every parameter of the layers, the final norm and the head read once per step
    # (the embedding table only at the step's BATCH tokens), float32.
    layer = 2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD_DIM + 3 * WIDTH * FFN + 2 * WIDTH
    weights = (LAYERS * layer + WIDTH + VOCAB * WIDTH) * ITEMSIZE  # 70272
    assert sum(n.cost.weight_bytes_read for n in dynamic.decode.nodes
               if n.module.startswith(("model.layers.", "model.norm", "lm_head"))) == weights
    embedding = next(n for n in dynamic.decode.nodes if n.op == "aten.embedding.default")
    assert embedding.cost.weight_bytes_read == BATCH * WIDTH * ITEMSIZE


def test_request_total_is_the_prefill_plus_the_closed_form_sum(dynamic):
    steps = dynamic.decode_positions
    assert list(steps) == [PROMPT, PROMPT + 1, PROMPT + 2]  # P .. P + G - 2
    looped = dynamic.prefill.total
    for past in steps:
        looped = looped + dynamic.step_counts(past)
    assert dynamic.total == looped
    # By hand: G - 1 = 3 steps of CONSTANT_MACS, and attention over past + 1 keys summed over
    # past = 5, 6, 7: 6 + 7 + 8 = 21 keys.
    assert dynamic.total.macs == (dynamic.prefill.total.macs + 3 * CONSTANT_MACS
                                  + attention_macs(21))


def test_one_new_token_is_the_prefill_alone(model, prompt):
    report = analyze_generation(model, prompt, new_tokens=1)
    assert report.total == report.prefill.total


def test_static_cache_executes_attention_over_the_whole_cache(static):
    assert static.work == "executed" and static.decode.symbols == []
    assert static.step(5) == static.step(12)  # one graph for every position
    # Attention over all 16 entries of the buffer, padding included.
    assert static.decode.total.macs == CONSTANT_MACS + attention_macs(16)
    row = BATCH * LAYERS * 2 * KV_HEADS * HEAD_DIM * ITEMSIZE
    assert static.kv_cache.bytes_read == row * 16 and static.kv_cache.bytes_written == row
    # The request: the prefill and G - 1 = 3 identical steps.
    assert static.total == static.prefill.total + static.decode.total.scaled(3)
    assert static.prefill.uncounted == [] and static.decode.uncounted == []


def test_generation_report_round_trips_through_json(dynamic, static):
    for report in (dynamic, static):
        assert GenerationReport.model_validate_json(report.model_dump_json()) == report


def test_a_model_without_a_cache_is_a_typed_error():
    with pytest.raises(GenerationError, match="Hugging Face"):
        analyze_generation(torch.nn.Linear(4, 4), torch.zeros(1, 3, dtype=torch.long),
                           new_tokens=2)


def test_a_prompt_that_is_no_token_ids_is_an_input_error_naming_the_model(model):
    # Floats of shape (1, 3, 8): an image-like input, not (batch, prompt length) token ids.
    with pytest.raises(InputError, match=r"and LlamaForCausalLM does not take one: .* it was "
                                         r"given a float32 tensor of shape \[1, 3, 8\]"):
        analyze_generation(model, torch.zeros(1, 3, 8), new_tokens=2)


def test_arguments_are_checked(model, prompt):
    with pytest.raises(ValueError, match="new_tokens"):
        analyze_generation(model, prompt, new_tokens=0)
    with pytest.raises(ValueError, match="max_cache_len"):
        analyze_generation(model, prompt, new_tokens=8, cache="static", max_cache_len=6)
    with pytest.raises(TypeError, match="unknown keyword"):
        analyze_generation(model, prompt, new_tokens=2, warmup=3)
    assert exportflops.analyze_generation is analyze_generation


def test_the_per_token_table_shows_the_steps_the_report_holds(dynamic, static):
    text = exportflops.flops_report(dynamic, as_string=False)
    lines = text.splitlines()
    assert "useful work, dynamic cache" in lines[0]
    # The first, middle and last step of the request: past = 5, 6, 7.
    for past in (5, 6, 7):
        row = next(line for line in lines if line.startswith(f"decode, past={past} "))
        cells = row.split()
        assert int(cells[3]) == past + 1  # keys attended
        assert int(cells[4]) == dynamic.step_counts(past).flops
    request = next(line for line in lines if line.startswith("request")).split()
    assert int(request[1]) == BATCH * (PROMPT + NEW - 1)  # tokens through the model
    assert int(request[3]) == dynamic.total.flops
    assert "executed work, static cache of 16 entries" in exportflops.flops_report(static)


def test_the_command_prints_the_table_and_writes_the_report(tmp_path, capsys):
    from exportflops.cli import main

    factory = tmp_path / "tiny.py"
    factory.write_text(
        "import torch, transformers\n"
        "def build():\n"
        f"    config = transformers.LlamaConfig(vocab_size={VOCAB}, hidden_size={WIDTH}, "
        f"intermediate_size={FFN}, num_hidden_layers={LAYERS}, num_attention_heads={HEADS}, "
        f"num_key_value_heads={KV_HEADS}, tie_word_embeddings=False)\n"
        "    return transformers.LlamaForCausalLM(config).eval()\n")
    spec = f"{factory}:build"
    assert main([spec, "--input", f"{BATCH},{PROMPT}:int64", "--generate", str(NEW)]) == 0
    assert "decode, past=7" in capsys.readouterr().out
    output = tmp_path / "generation.json"
    assert main([spec, "--input", f"{BATCH},{PROMPT}:int64", "--generate", str(NEW),
                 "--cache", "static", "--format", "json", "--output", str(output)]) == 0
    report = GenerationReport.model_validate_json(output.read_text())
    assert report.cache == "static" and report.max_cache_len == PROMPT + NEW
    assert main([spec, "--generate", "2", "--budget", "palm"]) == 2


def test_gpt2_decode_step_and_static_cache_by_hand():
    # GPT-2, width 32, 2 layers, 4 heads of dim 8 (no GQA: the cache has all 4 heads), tied
    # head over 64 tokens. Per token and layer: c_attn 3 x 32 x 32, c_proj 32 x 32, the MLP
    # 2 x 32 x 128: 12 x 32^2 = 12288 MACs; the head 32 x 64 = 2048.
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=128, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config).eval()
    prompt = torch.zeros(1, 5, dtype=torch.long, device="meta")
    constant = 2 * 12288 + 2048
    per_key = 2 * 2 * 4 * 8  # layers x (q.k, p.v) x heads x head_dim
    dynamic = analyze_generation(model, prompt, new_tokens=3)
    assert sympy.expand(dynamic.decode.total.macs - (constant + per_key * (PAST + 1))) == 0
    # Keys and values of 4 heads x 8 dims per layer, float32, past + 1 entries.
    assert sympy.expand(dynamic.kv_cache.bytes_read - 2 * 2 * 4 * 8 * 4 * (PAST + 1)) == 0
    static = analyze_generation(model, prompt, new_tokens=3, cache="static")
    assert static.max_cache_len == 5 + 3
    assert static.decode.total.macs == constant + per_key * 8


def test_the_closed_form_sum_of_a_polynomial_over_the_steps():
    from exportflops.records.generation import power_sum

    # 2L + 3 at L = 5, 6, 7: 13 + 15 + 17 = 45; L^2 at 1..4: 4 * 5 * 9 / 6 = 30; a constant 7
    # over 10 steps: 70; no step (last < first): 0.
    assert power_sum(sympy.sympify(2 * PAST + 3), PAST, 5, 7) == 45
    assert power_sum(PAST**2, PAST, 1, 4) == 30
    assert power_sum(sympy.Integer(7), PAST, 0, 9) == 70
    assert power_sum(PAST**2, PAST, 4, 3) == 0
