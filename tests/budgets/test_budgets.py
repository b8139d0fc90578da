"""Budgets against the figures their sources publish, and compare() against exported graphs.

Sources:
- nanoGPT ``transformer_sizing.ipynb`` (karpathy/nanoGPT, commit 1281615): GPT-2 124M as the
  notebook sizes it, its per-component FLOPs table, its parameter table and its PaLM check;
- nanoGPT ``scaling_laws.ipynb`` (commit 0082c48): its reproduction of Chinchilla's Table A4
  (appendix F FLOPs against 6ND), and its GPT-2 parameter count;
- Hoffmann et al. 2022 (arXiv:2203.15556) Table A4: the ratios, printed to two decimals;
- Kaplan et al. 2020 (arXiv:2001.08361) Table 1 and section 2.1: formulas, derived here;
- Hugging Face ``config.json`` of gpt2, meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1
  and Qwen/Qwen2-0.5B, and Meta's ``params.json`` of Llama 3 8B and 70B.
"""

import pytest

from exportflops import analyze
from exportflops.budgets import (
    DEFAULT_MAPPING,
    NOTEBOOK_GPT2,
    ROLES,
    Comparison,
    MappingRule,
    TransformerConfig,
    breakdown,
    chinchilla,
    compare,
    comparison_table,
    kaplan,
    karpathy,
    meta_ffn_width,
    mfu,
    model_flops_per_token,
    palm,
    ratio_to_6nd,
)
from exportflops.examples.gpt2 import gpt2
from exportflops.examples.llama import LLAMA3_8B, LlamaConfig, llama

BUDGETS = {"karpathy": karpathy, "kaplan": kaplan, "chinchilla": chinchilla, "palm": palm}

# --- Karpathy: transformer_sizing.ipynb, GPT-2 124M, bias-free, vocab 50257, T = 1024 --------

# The notebook's FLOPs table: per-block rows print one block ("each"), the rest the whole call.
KARPATHY_TABLE = {
    "attention/kqv": ("each", 3_623_878_656),
    "attention/scores": ("each", 1_610_612_736),
    "attention/reduce": ("each", 1_610_612_736),
    "attention/proj": ("each", 1_207_959_552),
    "attention": ("each", 8_053_063_680),
    "mlp/ffw1": ("each", 4_831_838_208),
    "mlp/ffw2": ("each", 4_831_838_208),
    "mlp": ("each", 9_663_676_416),
    "block": ("each", 17_716_740_096),
    "transformer": ("flops", 212_600_881_152),
    "dense": ("flops", 79_047_426_048),
    "forward_total": ("flops", 291_648_307_200),
}


@pytest.mark.parametrize("name", list(KARPATHY_TABLE))
def test_karpathy_budget_reproduces_every_row_of_the_notebooks_table(name):
    field, published = KARPATHY_TABLE[name]
    assert getattr(karpathy(NOTEBOOK_GPT2).item(name), field) == published


def test_karpathy_backward_and_total_are_the_notebooks():
    budget = karpathy(NOTEBOOK_GPT2)
    assert budget.backward == 583_296_614_400  # backward_total
    assert budget.training == 874_944_921_600  # total


def test_training_budget_gives_the_notebooks_a100_fraction():
    # "fraction of A100 used: 37.14%": 100 sequences per 0.755 s iteration, 312 TFLOPS bf16.
    achieved = karpathy(NOTEBOOK_GPT2).training * 100 / 0.755
    assert round(100 * achieved / 312e12, 2) == 37.14


def test_parameter_groups_match_the_notebooks_parameter_table():
    p = NOTEBOOK_GPT2.params()
    assert p.position_embedding == 786_432  # emebedding/position
    assert p.token_embedding == 38_597_376  # embedding/token
    assert p.attention == 12 * (2_360_064 - 768)  # 12 x (attention - attention/ln)
    assert p.ffn == 12 * (4_719_360 - 768)  # 12 x (mlp - mlp/ln)
    assert p.norms == 12 * 2 * 768 + 768  # attention/ln, mlp/ln per block; ln_f
    assert p.head == 0  # dense: tied to the token embedding
    assert p.total == 124_337_664  # "we see: 124337664"


# --- PaLM: appendix B's 6N + 12 L H Q T, as the sizing notebook applies it --------------------

def test_palm_model_flops_reproduce_the_notebooks_palm_check():
    # N = params without the position table (commit 1281615): "palm_flops: 875062886400".
    assert model_flops_per_token(NOTEBOOK_GPT2) * 1024 == 875_062_886_400
    assert round(875_062_886_400 / karpathy(NOTEBOOK_GPT2).training, 4) == 1.0001


def test_palm_model_flops_with_every_parameter_reproduce_the_earlier_notebook():
    # commit 0bb96d3 took N = params()['total']: "palm_flops: 879894724608, ... ratio: 1.0057".
    flops = model_flops_per_token(NOTEBOOK_GPT2, params=124_337_664) * 1024
    assert flops == 879_894_724_608
    assert round(flops / 874_944_921_600, 4) == 1.0057


def test_palm_forward_is_a_third_of_its_model_flops():
    assert 3 * palm(NOTEBOOK_GPT2).forward == model_flops_per_token(NOTEBOOK_GPT2) * 1024


def test_mfu_is_tokens_per_second_times_model_flops_over_peak():
    tokens_per_s = 100 * 1024 / 0.755  # the notebook's A100 run
    assert mfu(NOTEBOOK_GPT2, tokens_per_s, 312e12) == pytest.approx(
        tokens_per_s * 875_062_886_400 / 1024 / 312e12)


# --- Kaplan: Table 1 ---------------------------------------------------------------------------

def test_kaplan_n_is_12_layers_width_squared_for_gpt2_shapes():
    from exportflops.budgets.kaplan import n_params

    # d_attn = d, d_ff = 4d: N = 2 d L (2d + 4d) = 12 L d^2; the notebook's transformer params
    # (84,953,088) less its 2 LayerNorm weights per block are the same number.
    assert n_params(NOTEBOOK_GPT2) == 12 * 12 * 768**2 == 84_953_088 - 12 * 2 * 768


def test_kaplan_forward_is_2n_plus_the_context_term_per_token():
    n, L, n_ctx, d_attn = 84_934_656, 12, 1024, 768
    assert kaplan(NOTEBOOK_GPT2).forward == 1024 * (2 * n + 2 * L * n_ctx * d_attn)


def test_kaplan_attention_term_is_half_of_palms():
    config = TransformerConfig.from_meta_llama(LLAMA3_8B, seq_len=8192)
    assert 2 * kaplan(config).item("attention/mask").flops == palm(config).item("4LHQT").flops


# --- Chinchilla: appendix F against 6ND, Table A4 ----------------------------------------------

# (layers, d_model, ffw_size, heads, key_size), N as nanoGPT's chinchilla_params counts it
# (printed in scaling_laws.ipynb), its appendix-F FLOPs F = 3 x forward at S = 2048, vocab 32K
# without embeddings and logits (printed there), and Table A4's ratio F / 6ND.
TABLE_A4 = [
    ((10, 640, 2560, 10, 64), 73_825_280, 929_877_196_800, 1.03),
    ((20, 1024, 4096, 16, 64), 305_707_008, 4_135_248_199_680, 1.10),
    ((24, 1280, 5120, 10, 128), 552_604_160, 7_353_453_772_800, 1.08),
    ((26, 1792, 7168, 14, 128), 1_143_453_696, 14_670_316_437_504, 1.04),
    ((28, 2048, 8192, 16, 128), 1_593_126_912, 20_220_437_594_112, 1.03),
    ((40, 3584, 14336, 28, 128), 6_796_274_688, 83_021_046_743_040, 0.99),
]


def _chinchilla_config(layers, width, ffn, heads, key_size) -> TransformerConfig:
    return TransformerConfig(layers=layers, width=width, heads=heads, head_dim=key_size,
                             ffn_width=ffn, vocab=32_000, seq_len=2048)


@pytest.mark.parametrize("shape, n, flops, ratio", TABLE_A4, ids=[f"N={r[1]:,}" for r in TABLE_A4])
def test_chinchilla_layers_reproduce_nanogpts_table_a4_flops(shape, n, flops, ratio):
    assert 3 * chinchilla(_chinchilla_config(*shape)).item("layers").flops == flops


@pytest.mark.parametrize("shape, n, flops, ratio", TABLE_A4, ids=[f"N={r[1]:,}" for r in TABLE_A4])
def test_chinchilla_ratio_to_6nd_matches_table_a4_to_its_two_decimals(shape, n, flops, ratio):
    config = _chinchilla_config(*shape)
    assert abs(ratio_to_6nd(config, n, embeddings_and_logits=False) - ratio) <= 0.005
    # With the embeddings and logits appendix F lists, the ratio is larger: Table A4 left them
    # out (nanoGPT: "per author correspondence apparently there is typo in the paper").
    assert ratio_to_6nd(config, n) > ratio + 0.005


# --- Constructors from published configs -------------------------------------------------------

HF_GPT2 = {"model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
           "n_positions": 1024, "vocab_size": 50257}
HF_LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                "max_position_embeddings": 8192, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                "tie_word_embeddings": False}
HF_MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                 "max_position_embeddings": 32768, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
                 "vocab_size": 32000, "tie_word_embeddings": False}
HF_QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                "max_position_embeddings": 131072, "num_attention_heads": 14,
                "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
                "tie_word_embeddings": True}
META_LLAMA3_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                  "vocab_size": 128256, "multiple_of": 1024, "ffn_dim_multiplier": 1.3,
                  "norm_eps": 1e-05, "rope_theta": 500000.0}


def test_gpt2_config_gives_nanogpts_parameter_count_without_the_position_table():
    # scaling_laws.ipynb: gpt_params(gpt2) = 123.653376 M (no position table, head tied).
    assert TransformerConfig.from_hf(HF_GPT2).params().non_embedding == 123_653_376


@pytest.mark.parametrize("config, billions", [
    (HF_LLAMA3_8B, 8.03),  # meta-llama/Meta-Llama-3-8B: "8.03B params" on its Hub page
    (HF_MISTRAL_7B, 7.24),  # mistralai/Mistral-7B-v0.1: "7.24B params"
    (HF_QWEN2_05B, 0.49),  # Qwen/Qwen2-0.5B: "0.49B" (Qwen2 model card, tied embeddings)
], ids=["llama3-8b", "mistral-7b", "qwen2-0.5b"])
def test_hf_configs_give_the_published_parameter_counts(config, billions):
    assert round(TransformerConfig.from_hf(config).params().total / 1e9, 2) == billions


def test_llama3_8b_config_has_the_parameters_of_the_exported_model(llama8b_report):
    assert TransformerConfig.from_hf(HF_LLAMA3_8B).params().total == llama8b_report.params


@pytest.mark.parametrize("dim, multiple_of, ffn_width", [(4096, 1024, 14336), (8192, 4096, 28672)],
                         ids=["8b", "70b"])
def test_meta_ffn_width_gives_the_published_intermediate_size(dim, multiple_of, ffn_width):
    # intermediate_size in the Hub's config.json of Meta-Llama-3-8B and -70B.
    assert meta_ffn_width(dim, multiple_of, 1.3) == ffn_width


def test_meta_params_hf_config_and_the_example_describe_one_transformer():
    from_meta = TransformerConfig.from_meta_llama(META_LLAMA3_8B, seq_len=8192)
    assert from_meta == TransformerConfig.from_hf(HF_LLAMA3_8B)
    assert from_meta == TransformerConfig.from_meta_llama(LLAMA3_8B)


def test_qwen2_projects_queries_keys_and_values_with_biases():
    qwen, llama_layout = (TransformerConfig.from_hf(HF_QWEN2_05B),
                          TransformerConfig.from_llama(HF_QWEN2_05B))
    # 24 layers x (14 + 2 x 2) heads x 64 of query, key and value bias.
    assert qwen.params().attention - llama_layout.params().attention == 24 * (14 + 4) * 64


def test_mistral_and_objects_read_like_dicts():
    from types import SimpleNamespace

    as_object = TransformerConfig.from_mistral(SimpleNamespace(**HF_MISTRAL_7B))
    assert as_object == TransformerConfig.from_hf(HF_MISTRAL_7B)
    assert (as_object.kv_heads, as_object.head_dim, as_object.gated_ffn) == (8, 128, True)


def test_unknown_family_names_the_constructors():
    with pytest.raises(ValueError, match="from plain numbers"):
        TransformerConfig.from_hf({"model_type": "t5", "d_model": 512})


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        TransformerConfig(layers=1, width=64, heads=4, kv_heads=3, ffn_width=256, vocab=10,
                          seq_len=8)


# --- Budget arithmetic the sources imply for GQA, MQA, SwiGLU, tying and the head -------------

# A small GQA config, derived by hand below.
T, D, H, KV, HD, FFN, V, L = 64, 256, 8, 2, 32, 688, 1000, 2


def _small(**overrides) -> TransformerConfig:
    sizes = dict(layers=L, width=D, heads=H, kv_heads=KV, head_dim=HD, ffn_width=FFN,
                 gated_ffn=True, vocab=V, seq_len=T)
    return TransformerConfig(**(sizes | overrides))


@pytest.mark.parametrize("kv_heads", [H, KV, 1], ids=["mha", "gqa", "mqa"])
def test_kqv_projects_queries_for_every_head_and_keys_values_for_kv_heads(kv_heads):
    expected = L * 2 * T * D * (H + 2 * kv_heads) * HD
    assert karpathy(_small(kv_heads=kv_heads)).item("attention/kqv").flops == expected
    assert chinchilla(_small(kv_heads=kv_heads)).item("attention/kqv").flops == expected


def test_attention_pairs_use_every_query_head_whatever_the_kv_heads():
    assert (karpathy(_small(kv_heads=1)).item("attention/scores").flops
            == karpathy(_small()).item("attention/scores").flops == L * 2 * H * T * T * HD)


def test_swiglu_adds_a_gate_projection_as_large_as_the_up_projection():
    budget = karpathy(_small())
    assert budget.item("mlp/gate").flops == budget.item("mlp/ffw1").flops == L * 2 * T * D * FFN
    assert budget.item("mlp").flops == 3 * L * 2 * T * D * FFN
    assert [i.name for i in karpathy(_small(gated_ffn=False)).leaves("mlp")] == ["mlp/ffw1",
                                                                                 "mlp/ffw2"]


def test_a_tied_head_counts_its_table_once():
    tied, untied = _small(tied_embeddings=True).params(), _small().params()
    assert untied.total - tied.total == V * D
    assert tied.head == 0 and untied.head == V * D


@pytest.mark.parametrize("positions, rows", [("all", T), ("last", 1)])
def test_head_runs_on_the_positions_asked_for(positions, rows):
    config = _small(head_positions=positions)
    for budget, name in ((karpathy, "dense"), (chinchilla, "logits"), (kaplan, "de-embed"),
                         (palm, "2N/head")):
        assert budget(config).item(name).flops == 2 * rows * D * V


def test_causal_pairs_are_the_lower_triangle_with_its_diagonal():
    causal = _small(attention_pairs="causal")
    assert causal.pairs_per_layer() == H * T * (T + 1) // 2 == H * 2080
    assert karpathy(causal).item("attention/scores").flops == L * 2 * H * 2080 * HD


def test_batch_scales_every_component():
    one, four = karpathy(_small()), karpathy(_small(batch=4))
    assert all(b.flops == 4 * a.flops for a, b in zip(one.items, four.items))


# --- compare() on exported graphs --------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_graph():
    model, args = gpt2("meta")
    return model, analyze(model, args)


@pytest.fixture(scope="module")
def llama_small_report():
    config = LlamaConfig(vocab_size=V, dim=D, n_layers=L, n_heads=H, n_kv_heads=KV, head_dim=HD,
                         ffn_dim=FFN, max_seq_len=T)
    return config, analyze(*llama("meta", config, seq_len=T))


@pytest.fixture(scope="module")
def llama8b_report():
    return analyze(*llama("meta", LLAMA3_8B, seq_len=8192))


def _gpt2_budget(model, **overrides):
    config = TransformerConfig.from_nanogpt(model.config, head_positions="last")
    return karpathy(config.model_copy(update=overrides))


@pytest.mark.parametrize("name", list(KARPATHY_TABLE))
def test_gpt2_graph_matches_karpathys_budget_of_its_own_config_on_every_matmul_row(gpt2_graph,
                                                                                   name):
    model, report = gpt2_graph
    row = compare(report, _gpt2_budget(model)).row(name)
    assert row.diff_flops == 0 and row.counted_flops > 0


def test_gpt2_graph_forward_matmuls_total_the_published_figure(gpt2_graph):
    model, report = gpt2_graph
    # nanoGPT's model.py at inference, head on the last position only: the notebook's 12 blocks
    # (212,600,881,152) plus the head, 2 x 768 x 50304 = 77,266,944.
    assert compare(report, _gpt2_budget(model)).row("forward_total").counted_flops == \
        212_678_148_096


@pytest.mark.parametrize("name", ["attention/kqv", "attention/scores", "attention/reduce",
                                  "attention/proj", "mlp/ffw1", "mlp/ffw2", "block",
                                  "transformer"])
def test_gpt2_graph_matches_the_notebooks_own_per_block_figures(gpt2_graph, name):
    _, report = gpt2_graph
    field, published = KARPATHY_TABLE[name]
    row = compare(report, karpathy(NOTEBOOK_GPT2)).row(name)
    assert row.counted_flops == (12 * published if field == "each" else published)


def test_the_notebooks_head_differs_from_the_models_and_the_row_says_so(gpt2_graph):
    model, report = gpt2_graph
    row = compare(report, _gpt2_budget(model, head_positions="all")).row("dense")
    assert row.diff_flops == 2 * 768 * 50304 * (1 - 1024)
    assert "last position only" in row.reason


def test_a_causal_budget_differs_by_exactly_the_masked_pairs(gpt2_graph):
    model, report = gpt2_graph
    row = compare(report, _gpt2_budget(model, attention_pairs="causal")).row("attention/scores")
    masked_pairs = 12 * 12 * (1024 * 1024 - 1024 * 1025 // 2)  # L H (T^2 - T(T+1)/2)
    assert row.diff_flops == 2 * masked_pairs * 64 == 9_654_239_232
    assert "full T x T square" in row.reason and "9,654,239,232" in row.reason


def test_outside_rows_name_what_the_matmul_budget_leaves_out(gpt2_graph):
    model, report = gpt2_graph
    comparison = compare(report, _gpt2_budget(model))
    outside = {row.component for row in comparison.rows if row.kind == "outside"}
    assert {"outside: attention_rest", "outside: norm", "outside: activation",
            "outside: biases", "outside: residual"} <= outside
    # 12 blocks x 2 residual adds x T x d.
    assert comparison.row("outside: residual").counted_flops == 12 * 2 * 1024 * 768
    # Biases: c_attn 3d, attn.c_proj d, c_fc 4d, mlp.c_proj d per token per block.
    assert comparison.row("outside: biases").counted_flops == 12 * 1024 * (3 + 1 + 4 + 1) * 768


def _comparisons(report, config):
    return {name: compare(report, budget(config)) for name, budget in BUDGETS.items()}


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_llama_matmul_components_match_or_carry_a_reason(llama_small_report, budget):
    config, report = llama_small_report
    comparison = _comparisons(report, TransformerConfig.from_meta_llama(config, seq_len=T))[budget]
    for row in comparison.rows:
        assert row.diff_flops == 0 or row.reason, row.component


def test_llama_karpathy_budget_matches_every_matmul_row_exactly(llama_small_report):
    config, report = llama_small_report
    comparison = compare(report, karpathy(TransformerConfig.from_meta_llama(config, seq_len=T)))
    assert [r.component for r in comparison.rows if r.kind in ("matmul", "subtotal")
            and r.diff_flops] == []


def test_llama_graph_matches_every_matmul_row_of_palm_and_chinchilla(llama_small_report):
    config, report = llama_small_report
    budget_config = TransformerConfig.from_meta_llama(config, seq_len=T)
    for comparison, exact in ((compare(report, palm(budget_config)), ["2N/blocks", "2N/head",
                                                                      "4LHQT"]),
                              (compare(report, chinchilla(budget_config)),
                               ["attention/kqv", "attention/logits", "attention/values",
                                "attention/linear", "dense", "logits"])):
        assert [comparison.row(name).diff_flops for name in exact] == [0] * len(exact)


def test_llama3_8b_at_8192_matches_karpathys_matmul_rows_and_explains_the_rest(llama8b_report):
    comparisons = _comparisons(llama8b_report,
                               TransformerConfig.from_meta_llama(LLAMA3_8B, seq_len=8192))
    karpathy_rows = comparisons["karpathy"].rows
    assert all(r.diff_flops == 0 for r in karpathy_rows if r.kind in ("matmul", "subtotal"))
    for comparison in comparisons.values():
        assert all(r.reason for r in comparison.rows if r.diff_flops), comparison.source


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_rows_account_for_every_forward_flop_once(llama_small_report, budget):
    config, report = llama_small_report
    comparison = _comparisons(report, TransformerConfig.from_meta_llama(config, seq_len=T))[budget]
    leaves = [r for r in comparison.rows if r.kind in ("matmul", "other", "outside")]
    assert sum(r.counted_flops for r in leaves) == report.forward.flops
    assert comparison.rows[-1].counted_flops == report.forward.flops


def test_breakdown_covers_the_forward(llama8b_report):
    roles = breakdown(llama8b_report)
    assert set(roles) <= set(ROLES)
    assert sum(roles.values()) == llama8b_report.forward.flops


def test_mapping_overrides_the_default(gpt2_graph):
    model, report = gpt2_graph
    rules = [MappingRule(module="lm_head", role="other"), *DEFAULT_MAPPING]
    comparison = compare(report, _gpt2_budget(model), mapping=rules)
    assert comparison.row("dense").counted_flops == 0
    assert "no graph node has the role head" in comparison.row("dense").reason
    assert comparison.row("outside: other").counted_flops == 2 * 768 * 50304
    assert "lm_head" in comparison.row("outside: other").reason


def test_comparison_round_trips_through_json(gpt2_graph):
    model, report = gpt2_graph
    comparison = compare(report, _gpt2_budget(model, attention_pairs="causal"))
    assert Comparison.model_validate_json(comparison.model_dump_json()) == comparison


def test_rendered_graph_column_sums_to_the_printed_total(gpt2_graph):
    model, report = gpt2_graph
    comparison = compare(report, palm(TransformerConfig.from_nanogpt(model.config,
                                                                     head_positions="last")))
    lines = comparison_table(comparison, tablefmt="tsv", reason_width=None).splitlines()[2:]
    cells = {line.split("\t")[0].strip(): int(line.split("\t")[2].replace(",", ""))
             for line in lines}
    leaves = [r.component for r in comparison.rows if r.kind in ("matmul", "other", "outside")]
    assert sum(cells[name] for name in leaves) == cells["graph forward"]


# --- Hugging Face models, exported (skipped without transformers) ------------------------------

HF_SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
            "max_position_embeddings": 64}


def _hf_config(family):
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=256, n_layer=2, n_head=8, vocab_size=1000,
                                       n_positions=64, bos_token_id=0, eos_token_id=0)
    return {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
            "qwen2": transformers.Qwen2Config}[family](**HF_SMALL)


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_hf_model_matches_its_config_budget_on_every_matmul_row(family):
    import torch
    from transformers import AutoModelForCausalLM

    hf_config = _hf_config(family)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config).eval()
        tokens = torch.zeros((1, 64), dtype=torch.long)
    report = analyze(model, (tokens,), {"use_cache": False})
    config = TransformerConfig.from_hf(hf_config, seq_len=64)
    assert config.params().total == report.params
    comparison = compare(report, karpathy(config))
    assert [r.component for r in comparison.rows if r.kind in ("matmul", "subtotal")
            and r.diff_flops] == []
    assert all(r.reason for r in comparison.rows if r.diff_flops)
