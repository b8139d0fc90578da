"""GPT-2 124M (nanoGPT's model file) against Karpathy's transformer_sizing notebook.

Source: karpathy/nanoGPT transformer_sizing.ipynb, forward FLOPs of one 1024-token sequence,
2 FLOPs per MAC, matmuls only, attention over the full T x T square.
"""

import pytest

from exportflops import analyze
from exportflops.examples.gpt2 import gpt2

T, C, V, L = 1024, 768, 50304, 12


@pytest.fixture(scope="module")
def report():
    model, args = gpt2("meta")
    return analyze(model, args)


# Each figure from the notebook, re-derived: 2 FLOPs x rows x in x out.
KARPATHY_BLOCK = {
    "attn.c_attn": 3_623_878_656,  # 2 * T * C * 3C
    "attn.c_proj": 1_207_959_552,  # 2 * T * C * C
    "mlp.c_fc": 4_831_838_208,  # 2 * T * C * 4C
    "mlp.c_proj": 4_831_838_208,  # 2 * T * 4C * C
}


@pytest.mark.parametrize("layer", [0, 5, 11])
@pytest.mark.parametrize("component", list(KARPATHY_BLOCK), ids=list(KARPATHY_BLOCK))
def test_each_linear_matches_karpathys_component(report, layer, component):
    module = report.module(f"transformer.h.{layer}.{component}")
    assert module.inclusive.matmul_flops == KARPATHY_BLOCK[component]


def test_attention_scores_and_reduce_match_karpathy(report):
    # scores 2*T*T*C = 1,610,612,736 and reduce the same: the SDPA node of one block.
    sdpa = [n for n in report.nodes if n.module == "transformer.h.0.attn"
            and n.op == "aten.scaled_dot_product_attention.default"]
    assert len(sdpa) == 1
    assert sdpa[0].cost.matmul_flops == 1_610_612_736 + 1_610_612_736


def test_block_attention_and_mlp_match_karpathy(report):
    for layer in range(L):
        assert report.module(f"transformer.h.{layer}.attn").inclusive.matmul_flops == 8_053_063_680
        assert report.module(f"transformer.h.{layer}.mlp").inclusive.matmul_flops == 9_663_676_416
        assert report.module(f"transformer.h.{layer}").inclusive.matmul_flops == 17_716_740_096


def test_forward_matmul_total_is_karpathys_transformer_plus_last_position_head(report):
    # 212,600,881,152 for the 12 blocks + 2 * 768 * 50304 for the head on the last position.
    assert 12 * 17_716_740_096 + 2 * C * V == 212_678_148_096
    assert report.total.matmul_flops == 212_678_148_096


def test_causal_effective_count_halves_the_attention_square(report):
    # Top-left causal mask over T x T keeps T(T+1)/2 pairs; the masked rest is T(T-1)/2 pairs
    # per head, each with 2*hs MACs (q.k and p.v): 12 layers x 12 heads x T(T-1)/2 x 2 x 64.
    assert report.total.masked_macs == L * 12 * (T * (T - 1) // 2) * 2 * 64


def test_tied_embedding_is_counted_once(report):
    # wte 50304*768 = 38,633,472; wpe 1024*768 = 786,432; ln_f 2*768 = 1,536; per block:
    # ln_1 + ln_2 2*1,536, c_attn 768*2304 + 2304, attn.c_proj 768*768 + 768,
    # c_fc 768*3072 + 3072, mlp.c_proj 3072*768 + 768 = 7,087,872; x 12 = 85,054,464.
    # The tied lm_head adds nothing: 38,633,472 + 786,432 + 1,536 + 85,054,464.
    assert report.params == 124_475_904
    # named_parameters() meets transformer.wte.weight first and drops lm_head.weight.
    assert [(t.name, t.counted_as) for t in report.tied_parameters] == [
        ("lm_head.weight", "transformer.wte.weight")]
    assert report.module("lm_head").params == 0
    assert report.module("lm_head").tied_params == ["weight"]


def test_every_node_is_counted(report):
    assert report.uncounted == []
    assert report.coverage == 1.0
