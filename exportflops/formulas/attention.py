"""Attention: SDPA and its fused kernels, and PyTorch's fused MHA / encoder-layer fast paths.

Counted dense, over every (query, key) pair: two contractions per pair (``q . k`` over the
head dim, ``p . v`` over the value dim), plus per score the scale (1), the mask add when there is
a mask (1), the softmax (5, as `reduce.softmax`) and in training dropout (2). With a causal flag
the part on masked pairs is also reported as ``masked_flops``/``masked_macs``. Causal masks are
top-left aligned, as ``torch.nn.functional.scaled_dot_product_attention`` documents. Flex
attention's masked part is the scores in the blocks its block mask skips.
"""

from __future__ import annotations

import math

import sympy
import torch

from ..errors import FormulaError
from .norm import STATS_FLOPS
from .reduce import SOFTMAX_FLOPS_PER_ELEMENT
from .registry import FLOPS_PER_MAC, Cost, OpCall, TensorMeta, register_formula, aten


def attention_work(heads, q_len, kv_len, qk_dim, v_dim, *, masked: bool, causal: bool,
                   dropout, skipped_scores=0) -> Cost:
    """Arithmetic of softmax(q k^T * scale + mask) v over ``heads`` independent slices.

    A slice is one (batch, head) pair. The masked work is that of the pairs a causal mask
    discards, or the ``skipped_scores`` a block-sparse kernel never visits (flex attention).

    Bytes are left at zero: the caller knows which tensors the kernel reads.
    """
    per_score_flops = (FLOPS_PER_MAC * (qk_dim + v_dim) + 1 + SOFTMAX_FLOPS_PER_ELEMENT
                       + (1 if masked or causal else 0) + (2 if _nonzero(dropout) else 0))
    scores = heads * q_len * kv_len
    masked_scores = causal_masked_scores(heads, q_len, kv_len) if causal else skipped_scores
    return Cost(
        flops=scores * per_score_flops,
        macs=scores * (qk_dim + v_dim),
        masked_flops=masked_scores * per_score_flops,
        masked_macs=masked_scores * (qk_dim + v_dim),
    )


def causal_masked_scores(heads, q_len, kv_len):
    """Scores a top-left causal mask discards over ``heads`` slices."""
    return heads * (q_len * kv_len - causal_pairs(q_len, kv_len))


def causal_pairs(q_len, kv_len):
    """Unmasked (i, j) pairs of a top-left causal mask ``j <= i``: sum_i min(i + 1, kv_len)."""
    if isinstance(q_len, int) and isinstance(kv_len, int):
        shorter = min(q_len, kv_len)
        return shorter * (shorter + 1) // 2 + (q_len - shorter) * kv_len
    return sympy.Piecewise(
        (q_len * (q_len + 1) / 2, sympy.Le(q_len, kv_len)),
        (kv_len * (kv_len + 1) / 2 + (q_len - kv_len) * kv_len, True),
    )


def _nonzero(p) -> bool:
    return p is not None and p != 0


def attention_dims(call: OpCall, *, heads_first: bool = True) -> tuple:
    """(slices, q_len, kv_len, qk_dim, v_dim) of a call's query, key and value.

    SDPA and its CPU kernels take (..., heads, seq, dim), keys possibly with fewer heads (GQA);
    the CUDA kernels under it take (batch, seq, heads, dim)."""
    q, k, v = call["query"], call["key"], call["value"]
    if heads_first:
        return math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    batch, q_len, heads, qk_dim = q.shape
    return batch * heads, q_len, k.shape[1], qk_dim, v.shape[-1]


def kernel_is_causal(call: OpCall) -> bool:
    """The CUDA kernels say causal by a flag or by mask type 1 (top-left causal)."""
    return bool(call.get("is_causal")) or call.get("custom_mask_type", 0) == 1


def _bhld(call: OpCall, *, causal: bool, masked: bool, dropout=0) -> Cost:
    return attention_work(*attention_dims(call), masked=masked, causal=causal,
                          dropout=dropout) + call.cost()


@register_formula(
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu
)
def sdpa(call: OpCall) -> Cost:
    return _bhld(call, causal=bool(call.get("is_causal")), masked=call.get("attn_mask") is not None,
                 dropout=call.get("dropout_p"))


@register_formula(aten._scaled_dot_product_flash_attention)
def sdpa_flash(call: OpCall) -> Cost:
    return _bhld(call, causal=bool(call["is_causal"]), masked=False, dropout=call["dropout_p"])


@register_formula(aten._scaled_dot_product_efficient_attention,
                  aten._scaled_dot_product_cudnn_attention,
                  aten._scaled_dot_product_fused_attention_overrideable)
def sdpa_with_bias(call: OpCall) -> Cost:
    return _bhld(call, causal=bool(call["is_causal"]), masked=call.get("attn_bias") is not None,
                 dropout=call["dropout_p"])


def _refuse_packed(call: OpCall) -> None:
    if call.get("cum_seq_q") is not None or call.get("cu_seqlens_q") is not None:
        raise FormulaError(
            "variable-length (packed) attention: the per-sequence lengths live in the "
            "cu_seqlens tensor's values, which a static count cannot see"
        )


@register_formula(aten._flash_attention_forward, aten._efficient_attention_forward)
def attention_forward_kernel(call: OpCall) -> Cost:
    """The kernels under SDPA on CUDA take (batch, seq, heads, dim).

    SDPA itself takes (batch, heads, seq, dim)."""
    _refuse_packed(call)
    return attention_work(*attention_dims(call, heads_first=False),
                          masked=call.get("bias") is not None, causal=kernel_is_causal(call),
                          dropout=call["dropout_p"]) + call.cost()


@register_formula(aten._cudnn_attention_forward)
def cudnn_attention_forward(call: OpCall) -> Cost:
    """cuDNN's kernel under SDPA, (batch, heads, seq, dim) as SDPA's; torch calls it directly
    for packed variable-length sequences (nested tensors, ``varlen_attn``), not counted."""
    _refuse_packed(call)
    return sdpa_with_bias(call)


def _multi_head(query: TensorMeta, key: TensorMeta, embed_dim, num_heads, *, masked: bool) -> Cost:
    """nn.MultiheadAttention's fused path: q/k/v projections, attention, output projection."""
    *batch, q_len, _ = query.shape
    kv_len = key.shape[-2]
    rows = math.prod(batch)
    projected_tokens = rows * (q_len + 2 * kv_len + q_len)  # q, k, v in; output projection
    macs = projected_tokens * embed_dim * embed_dim
    projections = Cost(flops=FLOPS_PER_MAC * macs + projected_tokens * embed_dim, macs=macs)
    head_dim = embed_dim // num_heads
    return projections + attention_work(rows * num_heads, q_len, kv_len, head_dim, head_dim,
                                        masked=masked, causal=False, dropout=0)


@register_formula(aten._native_multi_head_attention)
def native_multi_head_attention(call: OpCall) -> Cost:
    return _multi_head(call["query"], call["key"], call["embed_dim"], call["num_head"],
                       masked=call.get("mask") is not None) + call.cost()


@register_formula(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer(call: OpCall) -> Cost:
    """nn.TransformerEncoderLayer's fused path: self-attention, two layer norms, the FFN, and
    two residual adds."""
    src, embed_dim = call["src"], call["embed_dim"]
    tokens = src.numel // embed_dim
    ffn_dim = call["ffn_weight_1"].shape[0]
    attention = _multi_head(src, src, embed_dim, call["num_heads"],
                            masked=call.get("mask") is not None)
    ffn_macs = 2 * tokens * embed_dim * ffn_dim
    # ffn biases (ffn_dim + embed_dim) and activation (ffn_dim) per token; per element of the
    # width: two residual adds, and two affine layer norms (STATS_FLOPS + weight + bias).
    per_token_norms = embed_dim * (2 + 2 * (STATS_FLOPS + 2))
    elementwise = tokens * (2 * ffn_dim + embed_dim) + tokens * per_token_norms
    ffn = Cost(flops=FLOPS_PER_MAC * ffn_macs + elementwise, macs=ffn_macs)
    return attention + ffn + call.cost()


def flex_dims(call: OpCall) -> tuple:
    """(slices, q_len, kv_len, qk_dim, v_dim) of a flex attention call, forward or backward:
    both take query, key and value first. Slices count the query heads (GQA too)."""
    q, k, v = call["arg0"], call["arg1"], call["arg2"]
    return math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]


@register_formula(torch.ops.higher_order.flex_attention)
def flex_attention(call: OpCall) -> Cost:
    """torch.nn.attention.flex_attention, counted dense like SDPA (what torch's FlopCounterMode
    counts), with the work in the blocks its block mask skips also reported as ``masked_*``
    (``skipped_pairs``, which `graph.flex_blocks` reads from the mask's ``mask_mod``; None, and
    nothing masked, when it cannot): the causal-effective count is the block-sparse kernel's.
    The ``score_mod`` subgraph's ops are counted as their own nodes, once per score (see
    walk._iterations)."""
    return attention_work(*flex_dims(call), masked=False, causal=False, dropout=0,
                          skipped_scores=call.get("skipped_pairs") or 0) + call.cost()
