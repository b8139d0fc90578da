"""Karpathy's per-component forward budget (karpathy/nanoGPT, ``transformer_sizing.ipynb``).

The notebook counts "weight FLOPs" only: every matmul at 2 FLOPs per multiply-accumulate
(``A (BxC) @ B (CxD)`` is ``2*B*C*D``); LayerNorm, softmax, activations and biases are left out
as negligible. Attention is counted over the full T x T square. For GPT-2 124M (12 layers, 12
heads, width 768, T = 1024, vocab 50257, head tied and on all positions) it prints, per block:
attention/kqv 3,623,878,656, scores and reduce 1,610,612,736 each, proj 1,207,959,552, mlp/ffw1
and ffw2 4,831,838,208 each, block 17,716,740,096; transformer 212,600,881,152, dense
79,047,426,048, forward_total 291,648,307,200, and backward = 2 x forward.

Generalized here, in the notebook's own steps, to grouped-query attention (keys and values
projected to KV heads), a gated FFN (one more d x f projection, ``mlp/gate``), a batch, a head
on the last position only, and attention over the causal half (`TransformerConfig.attention_pairs`).
"""

from __future__ import annotations

from .budget import (Budget, BudgetItem, head_alternatives, pairs_alternative, pairs_formula,
                     subtotal)
from .config import TransformerConfig

SOURCE = "Karpathy, nanoGPT transformer_sizing.ipynb"
URL = "https://github.com/karpathy/nanoGPT/blob/master/transformer_sizing.ipynb"

#: The notebook's own GPT-2 124M: bias-free (its ``assert not bias``), vocab 50257, one
#: 1024-token sequence, the tied head on every position.
NOTEBOOK_GPT2 = TransformerConfig(layers=12, width=768, heads=12, ffn_width=4 * 768, vocab=50257,
                                  seq_len=1024, tied_embeddings=True, learned_positions=1024,
                                  name="GPT-2 124M (transformer_sizing.ipynb)")


def karpathy(config: TransformerConfig) -> Budget:
    """Forward FLOPs per component, in the notebook's names and order."""
    c = config
    B, T, d, L, V = c.batch, c.seq_len, c.width, c.layers, c.vocab
    pairs = c.pairs_per_layer()  # (query, key) pairs of one block, every head, the batch
    per_pair = pairs_alternative(c, 2 * c.head_dim)

    def per_block(name: str, each: int, formula: str, roles: list[str], unit: str, units: int,
                  **extra) -> BudgetItem:
        return BudgetItem(name=name, kind="matmul", each=each, repeats=L, formula=formula,
                          roles=roles, unit=unit, units=L * units, **extra)

    # 1) the projection to key, query, values: T rows x d in x (H + 2 KV) hd out
    kqv = per_block("attention/kqv", 2 * B * T * d * (c.q_width + 2 * c.kv_width),
                    "2 B T d (H + 2 KV) hd", ["qkv"], "token", B * T)
    # 2) the attention scores q . k: hd MACs per (query, key) pair per head
    scores = per_block("attention/scores", 2 * pairs * c.head_dim, f"2 {pairs_formula(c)} hd",
                       ["scores"], "(query, key) pair", pairs, alternatives=per_pair)
    # 3) the reduction of the values (B, H, T, T) x (B, H, T, hd) -> (B, H, T, hd)
    reduce = per_block("attention/reduce", 2 * pairs * c.head_dim, f"2 {pairs_formula(c)} hd",
                       ["reduce"], "(query, key) pair", pairs, alternatives=per_pair)
    # 4) the final linear projection: T rows x H hd in x d out
    proj = per_block("attention/proj", 2 * B * T * c.q_width * d, "2 B T (H hd) d",
                     ["attention_out"], "token", B * T)
    attention = subtotal("attention", [kqv, scores, reduce, proj], repeats=L)

    ffw1 = per_block("mlp/ffw1", 2 * B * T * d * c.ffn_width, "2 B T d f", ["ffn_up"], "token",
                     B * T)
    mlp_items = [ffw1]
    if c.gated_ffn:
        mlp_items.append(per_block("mlp/gate", 2 * B * T * d * c.ffn_width, "2 B T d f",
                                   ["ffn_gate"], "token", B * T))
    mlp_items.append(per_block("mlp/ffw2", 2 * B * T * c.ffn_width * d, "2 B T f d",
                               ["ffn_down"], "token", B * T))
    mlp = subtotal("mlp", mlp_items, repeats=L)

    block = subtotal("block", [attention, mlp], repeats=L)
    transformer = subtotal("transformer", [block], formula="L x block")
    dense = BudgetItem(name="dense", kind="matmul", each=2 * c.head_rows * d * V, repeats=1,
                       formula="2 B T d V" if c.head_positions == "all" else "2 B d V",
                       roles=["head"], unit="position", units=c.head_rows,
                       alternatives=head_alternatives(c))
    forward = subtotal("forward_total", [transformer, dense])
    return Budget(source=SOURCE, url=URL, config=c,
                  scope="matmuls only, attention over the full T x T square; norms, softmax, "
                        "activations, biases and residual adds left out",
                  items=[kqv, scores, reduce, proj, attention, *mlp_items, mlp, block,
                         transformer, dense, forward],
                  total="forward_total")

