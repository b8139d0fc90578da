"""The Llama example (Meta's llama3 reference in plain torch) against hand derivations.

MACs are derived here from the config, one matmul at a time, in the convention of Karpathy's
sizing notebook (karpathy/nanoGPT ``transformer_sizing.ipynb``): a (rows x in) @ (in x out)
product is rows * in * out MACs, attention counted over the full T x T square (scores q.k and
reduce p.v, head_dim MACs each per (query, key) pair). Parameter counts are derived from the
module shapes of Meta's llama/model.py and compared with the published totals.
"""

import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest

from exportflops import Report, analyze
from exportflops.examples import EXAMPLES
from exportflops.examples.llama import LLAMA3_8B, LLAMA3_70B, LlamaConfig, llama

# A small config with every Llama feature: GQA (4 query heads per key/value head), SwiGLU of
# width ~ 8/3 d rounded (688 = 256 * 8/3 rounded up to a multiple of 16), untied head.
T, D, H, KV, HD, FFN, V, L = 64, 256, 8, 2, 32, 688, 1000, 2
SMALL = LlamaConfig(vocab_size=V, dim=D, n_layers=L, n_heads=H, n_kv_heads=KV, head_dim=HD,
                    ffn_dim=FFN, max_seq_len=T)

# 1. Each projection: T rows x in x out.
WQ = T * D * (H * HD)  # 4,194,304
WK = WV = T * D * (KV * HD)  # 1,048,576 each: only KV heads of keys and values are projected
WO = T * (H * HD) * D  # 4,194,304
# 2. Attention over the dense T x T square of every query head (keys/values expanded to H heads).
SCORES = REDUCE = H * T * T * HD  # 1,048,576 each
# 3. SwiGLU: gate w1 and up w3 (d -> ffn), down w2 (ffn -> d).
W1 = W3 = W2 = T * D * FFN  # 11,272,192 each
ATTENTION = WQ + WK + WV + SCORES + REDUCE + WO  # 12,582,912
FEED_FORWARD = W1 + W2 + W3  # 33,816,576
# 4. The untied head on all T positions.
HEAD = T * D * V  # 16,384,000


@pytest.fixture(scope="module")
def report():
    model, args = llama("meta", SMALL, seq_len=T)
    return analyze(model, args)


MODULE_MACS = {
    "attention.wq": WQ, "attention.wk": WK, "attention.wv": WV, "attention.wo": WO,
    "attention": ATTENTION,
    "feed_forward.w1": W1, "feed_forward.w2": W2, "feed_forward.w3": W3,
    "feed_forward": FEED_FORWARD,
    "attention_norm": 0, "ffn_norm": 0,  # RMSNorm has no contraction
    "": ATTENTION + FEED_FORWARD,  # the block itself
}


@pytest.mark.parametrize("layer", range(L))
@pytest.mark.parametrize("component", list(MODULE_MACS), ids=[c or "block" for c in MODULE_MACS])
def test_each_module_of_each_layer_has_the_hand_derived_macs(report, layer, component):
    path = f"layers.{layer}" + (f".{component}" if component else "")
    assert report.module(path).inclusive.macs == MODULE_MACS[component]


def test_sdpa_node_counts_scores_and_reduce_over_the_expanded_heads(report):
    sdpa = [n for n in report.nodes if n.module == "layers.0.attention"
            and n.op == "aten.scaled_dot_product_attention.default"]
    assert len(sdpa) == 1
    assert sdpa[0].cost.macs == SCORES + REDUCE


def test_head_applies_to_every_position(report):
    assert report.module("output").inclusive.macs == HEAD


def test_total_macs_are_the_layers_plus_the_head(report):
    assert L * (ATTENTION + FEED_FORWARD) + HEAD == 109_182_976
    assert report.total.macs == 109_182_976


def test_causal_mask_discards_the_upper_triangle_of_every_head(report):
    # Top-left causal mask: T(T-1)/2 masked pairs per head, each with HD + HD MACs (q.k, p.v).
    assert report.total.masked_macs == L * H * (T * (T - 1) // 2) * 2 * HD


def small_params(tied: bool = False) -> int:
    embedding = V * D  # 256,000
    per_layer = (D * H * HD + 2 * D * KV * HD + H * HD * D  # wq, wk, wv, wo: 163,840
                 + 3 * D * FFN  # w1, w2, w3: 528,384
                 + 2 * D)  # attention_norm, ffn_norm weights: 512
    final_norm = D
    head = 0 if tied else V * D
    return embedding + L * per_layer + final_norm + head


def test_params_equal_the_hand_count(report):
    assert small_params() == 1_897_728
    assert report.params == small_params()
    assert report.tied_parameters == []


def test_every_node_is_counted(report):
    # RoPE (arange, pow, mul, cat, cos, sin, neg), RMSNorm, SiLU and the GQA expand included.
    assert report.uncounted == []
    assert report.coverage == 1.0


def test_tied_embeddings_count_the_shared_weight_once():
    model, args = llama("meta", replace(SMALL, tie_embeddings=True), T)
    tied = analyze(model, args)
    # named_parameters() meets tok_embeddings.weight first and drops output.weight.
    assert tied.params == small_params(tied=True) == 1_897_728 - V * D
    assert [(t.name, t.counted_as) for t in tied.tied_parameters] == [
        ("output.weight", "tok_embeddings.weight")]
    assert tied.module("output").inclusive.macs == HEAD


def test_logits_last_only_applies_the_head_to_one_position():
    model, args = llama("meta", replace(SMALL, logits_last_only=True), T)
    last = analyze(model, args)
    assert last.module("output").inclusive.macs == 1 * D * V  # one row
    assert last.total.macs == L * (ATTENTION + FEED_FORWARD) + D * V


def test_gqa_config_rejects_heads_not_divisible_by_kv_heads():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        LlamaConfig(vocab_size=V, dim=D, n_layers=1, n_heads=6, n_kv_heads=4, head_dim=HD,
                    ffn_dim=FFN)


def test_example_is_registered():
    assert EXAMPLES["llama"] is llama


def llama_params(c: LlamaConfig) -> int:
    """Meta's llama/model.py module by module (no biases anywhere; RMSNorm has a weight only)."""
    embedding = c.vocab_size * c.dim
    attention = (c.dim * c.n_heads * c.head_dim  # wq
                 + 2 * c.dim * c.n_kv_heads * c.head_dim  # wk, wv
                 + c.n_heads * c.head_dim * c.dim)  # wo
    feed_forward = 3 * c.dim * c.ffn_dim  # w1, w2, w3
    norms = 2 * c.dim  # attention_norm, ffn_norm
    head = 0 if c.tie_embeddings else c.vocab_size * c.dim
    return embedding + c.n_layers * (attention + feed_forward + norms) + c.dim + head


def test_llama3_8b_has_its_published_parameter_count():
    # 8,030,261,248: the total of Meta's meta-llama/Meta-Llama-3-8B checkpoint ("8.03B" on its
    # Hugging Face model page). Counted on meta: no memory is allocated.
    assert llama_params(LLAMA3_8B) == 8_030_261_248
    model, _ = llama("meta", LLAMA3_8B, seq_len=16)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


# The acceptance test: Llama-3-70B on meta at T = 4096 analyzes with peak RSS growth under 2 GiB.
# The analysis runs in a fresh interpreter so the high-water mark (ru_maxrss) is its own: the
# growth is the peak after analyze() minus the peak once torch and exportflops are imported.
CHILD = textwrap.dedent("""
    import resource, sys
    import torch, exportflops
    from exportflops.examples.llama import LLAMA3_70B, llama

    def peak_bytes():
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB

    before = peak_bytes()
    model, args = llama("meta", LLAMA3_70B, seq_len=4096)
    report = exportflops.analyze(model, args)
    after = peak_bytes()
    with open(sys.argv[1], "w") as f:
        f.write(report.model_dump_json())
    print(before, after)
""")


@pytest.fixture(scope="module")
def llama3_70b(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama3_70b") / "report.json"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=600)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-4000:]
    before, after = map(int, done.stdout.split()[-2:])
    print(f"Llama-3-70B on meta, T=4096: {seconds:.1f} s in the child, "
          f"peak RSS growth {(after - before) / 2**30:.3f} GiB")
    return Report.model_validate_json(path.read_text()), after - before


def test_llama3_70b_at_4096_tokens_analyzes_in_under_2_gib_of_rss(llama3_70b):
    _, growth = llama3_70b
    assert growth < 2 * 2**30


def test_llama3_70b_has_its_published_parameter_count(llama3_70b):
    # 70,553,706,496: the total of Meta's meta-llama/Meta-Llama-3-70B checkpoint ("70.6B").
    report, _ = llama3_70b
    assert llama_params(LLAMA3_70B) == 70_553_706_496
    assert report.params == 70_553_706_496


def test_llama3_70b_macs_at_4096_tokens_match_the_hand_derivation(llama3_70b):
    report, _ = llama3_70b
    t, d, h, kv, hd, ffn, vocab, layers = 4096, 8192, 64, 8, 128, 28672, 128256, 80
    attention = (t * d * h * hd  # wq
                 + 2 * t * d * kv * hd  # wk, wv
                 + 2 * h * t * t * hd  # scores and reduce, dense square over expanded heads
                 + t * h * hd * d)  # wo
    feed_forward = 3 * t * d * ffn
    head = t * d * vocab  # untied head on all 4096 positions
    assert report.module("layers.79.attention").inclusive.macs == attention
    assert report.module("layers.79.feed_forward").inclusive.macs == feed_forward
    assert report.module("output").inclusive.macs == head
    assert report.total.macs == layers * (attention + feed_forward) + head
    assert report.uncounted == []
