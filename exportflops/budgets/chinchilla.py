"""Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models" (Chinchilla,
arXiv:2203.15556), appendix F: forward FLOPs of one sequence of length S, per component.

With d_attn = key_size x heads:

1. Embeddings: 2 S V d (the lookup counted as a one-hot matmul).
2. Per layer, attention: key, query and value projections 2 x 3 S d d_attn; key @ query logits
   2 S^2 d_attn; softmax 3 H S^2; softmax @ value 2 S^2 d_attn; final linear 2 S d_attn d.
3. Per layer, dense block: 2 S (d f + d f).
4. Final logits: 2 S d V.
5. Forward = embeddings + L (attention + dense) + logits; backward = 2 x forward.

Table A4 compares this count with 6ND at S = 2048, vocab 32K. nanoGPT's ``scaling_laws.ipynb``
reproduces its ratios (1.03, 1.10, 1.08, 1.04, 1.03, 0.99) only when the embeddings and final
logits are left out ("per author correspondence apparently there is typo in the paper"), hence
``embeddings_and_logits=False`` in `ratio_to_6nd`.

The items' ``formula`` strings write S as T (config.py's symbols), and H S^2 of the batch as
B H T T: the (query, key) pairs of one layer.
Generalized here to grouped-query attention (keys and values projected to KV heads), a gated
FFN (three d x f matrices), a batch of B sequences, and the per-score terms over the causal half
(`TransformerConfig.attention_pairs`).
"""

from __future__ import annotations

from .budget import (Budget, BudgetItem, head_alternatives, pairs_alternative, pairs_formula,
                     subtotal)
from .config import TransformerConfig

SOURCE = "Hoffmann et al. 2022 (Chinchilla), appendix F"
URL = "https://arxiv.org/abs/2203.15556"

GATHER = "a gather of table rows, no arithmetic (the graph's aten.embedding)"


def chinchilla(config: TransformerConfig) -> Budget:
    """Appendix F's forward FLOPs, per component, for ``batch`` sequences of ``seq_len``."""
    c = config
    B, S, d, L, V = c.batch, c.seq_len, c.width, c.layers, c.vocab
    scores = c.pairs_per_layer()  # attention logits of one layer, every head, the batch
    per_score = pairs_alternative(c, 2 * c.head_dim)

    def per_layer(name: str, each: int, formula: str, roles: list[str], unit: str, units: int,
                  kind: str = "matmul", **extra) -> BudgetItem:
        return BudgetItem(name=name, kind=kind, each=each, repeats=L, formula=formula,
                          roles=roles, unit=unit, units=L * units, **extra)

    embeddings = BudgetItem(name="embeddings", kind="matmul", each=2 * B * S * V * d, repeats=1,
                            formula="2 B S V d", roles=["embedding"], unit="token",
                            units=B * S, alternatives={GATHER: 0},
                            note="Chinchilla counts the lookup as a one-hot matmul")
    kqv = per_layer("attention/kqv", 2 * B * S * d * (c.q_width + 2 * c.kv_width),
                    "2 B S d (H + 2 KV) key_size", ["qkv"], "token", B * S)
    logits = per_layer("attention/logits", 2 * scores * c.head_dim,
                       f"2 {pairs_formula(c)} key_size", ["scores"], "score", scores,
                       alternatives=per_score)
    softmax = per_layer("attention/softmax", 3 * scores, f"3 {pairs_formula(c)}",
                        ["attention_rest"],
                        "score", scores, kind="other",
                        note="Chinchilla counts 3 FLOPs per score (nanoGPT's reading: "
                             "subtract the max, exp, divide)")
    values = per_layer("attention/values", 2 * scores * c.head_dim,
                       f"2 {pairs_formula(c)} key_size", ["reduce"], "score", scores,
                       alternatives=per_score)
    linear = per_layer("attention/linear", 2 * B * S * c.q_width * d, "2 B S d_attn d",
                       ["attention_out"], "token", B * S)
    attention = subtotal("attention", [kqv, logits, softmax, values, linear], repeats=L)
    projections = 3 if c.gated_ffn else 2
    dense = per_layer("dense", 2 * B * S * projections * d * c.ffn_width,
                      f"2 B S ({' + '.join(['d f'] * projections)})",
                      ["ffn_up", "ffn_gate", "ffn_down"], "token", B * S)
    layers = subtotal("layers", [attention, dense], formula="L x (attention + dense)")
    final_logits = BudgetItem(name="logits", kind="matmul", each=2 * c.head_rows * d * V,
                              repeats=1, formula="2 B S d V" if c.head_positions == "all"
                              else "2 B d V", roles=["head"], unit="position",
                              units=c.head_rows, alternatives=head_alternatives(c))
    forward = subtotal("forward", [embeddings, layers, final_logits])
    return Budget(source=SOURCE, url=URL, config=c,
                  scope="matmuls, the embedding lookup as a matmul, and 3 FLOPs per attention "
                        "score for the softmax; norms, activations, biases and residual adds "
                        "left out",
                  items=[embeddings, kqv, logits, softmax, values, linear, attention, dense,
                         layers, final_logits, forward],
                  total="forward")


def ratio_to_6nd(config: TransformerConfig, n_params: int, *,
                 embeddings_and_logits: bool = True) -> float:
    """Chinchilla's training FLOPs (3 x forward) over 6ND, D the budgeted tokens.

    ``embeddings_and_logits=False`` counts ``L (attention + dense)`` only: how Table A4's ratios
    were computed (see the module docstring). ``n_params`` is N as the 6ND estimate takes it.
    """
    budget = chinchilla(config)
    forward = budget.forward if embeddings_and_logits else budget.item("layers").flops
    return 3 * forward / (6 * n_params * config.tokens)
