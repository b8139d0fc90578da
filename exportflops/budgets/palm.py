"""Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways" (arXiv:2204.02311),
appendix B: model FLOPs per token 6N + 12 L H Q T (L layers, H heads, Q head dim, T sequence
length), the numerator of model FLOPs utilization (MFU = tokens/s x model FLOPs per token / peak
FLOP/s; rematerialization not counted).

N is read as nanoGPT's ``transformer_sizing.ipynb`` reads it: every parameter except the tables
that are only gathered (position table, untied token table); a tied token table counts, since
the head multiplies by it (`ParamCounts.non_embedding`). With that N, GPT-2 124M as the notebook
sizes it (bias-free, vocab 50257, T = 1024) gives (6N + 12 L H Q T) T = 875,062,886,400,
1.0001 x the notebook's own 3 x forward.

The forward third, 2N + 4 L H Q T per token, is split here into the parts of N so each can be
set against the graph: the blocks' matmul weights, the head, and the norm weights and biases
(which enter no matmul). Attention uses the H query heads: with grouped-query attention the
keys and values are shared, the (query, key) pairs are not.
"""

from __future__ import annotations

from .budget import (Budget, BudgetItem, head_alternatives, pairs_alternative, pairs_formula,
                     subtotal)
from .config import TransformerConfig

SOURCE = "Chowdhery et al. 2022 (PaLM), appendix B"
URL = "https://arxiv.org/abs/2204.02311"


def n_params(config: TransformerConfig) -> int:
    """N: the parameters less the tables that are only gathered (see the module docstring)."""
    return config.params().non_embedding


def model_flops_per_token(config: TransformerConfig, params: int | None = None) -> int:
    """6N + 12 L H Q T: training FLOPs per token (forward and backward); N is ``params`` when
    given, else `n_params`."""
    c = config
    n = n_params(c) if params is None else params
    return 6 * n + 12 * c.layers * c.heads * c.head_dim * c.seq_len


def mfu(config: TransformerConfig, tokens_per_second: float, peak_flop_per_s: float,
        params: int | None = None) -> float:
    """Model FLOPs utilization: tokens/s x (6N + 12 L H Q T) / peak FLOP/s (a dense peak)."""
    return tokens_per_second * model_flops_per_token(config, params) / peak_flop_per_s


def palm(config: TransformerConfig) -> Budget:
    """The forward third of 6N + 12 L H Q T, for every token of the call."""
    c = config
    p = c.params()
    tokens, L = c.tokens, c.layers
    head_weights = c.width * c.vocab
    block_weights = p.matmul_weights - head_weights
    elementwise = p.non_embedding - p.matmul_weights  # norm weights and biases
    blocks = BudgetItem(name="2N/blocks", kind="matmul", each=2 * tokens * block_weights,
                        repeats=1, formula="2 B T x (the blocks' projection weights)",
                        roles=["qkv", "attention_out", "ffn_up", "ffn_gate", "ffn_down"],
                        unit="token", units=tokens)
    head = BudgetItem(name="2N/head", kind="matmul", each=2 * c.head_rows * head_weights,
                      repeats=1, formula=("2 B T" if c.head_positions == "all" else "2 B")
                      + " x d V", roles=["head"], unit="position", units=c.head_rows,
                      alternatives=head_alternatives(c))
    rest = BudgetItem(name="2N/norms and biases", kind="other", each=2 * tokens * elementwise,
                      repeats=1, formula="2 B T x (norm weights + biases)",
                      roles=["norm", "biases"], unit="token", units=tokens,
                      note="PaLM's 6N counts every parameter of N as a matmul weight, 2 FLOPs "
                           "per token; norms and bias adds cost per element instead")
    pairs = c.pairs_per_layer()
    attention = BudgetItem(name="4LHQT", kind="matmul", each=4 * L * pairs * c.head_dim,
                           repeats=1, formula=f"4 L {pairs_formula(c)} Q",
                           roles=["scores", "reduce"],
                           unit="(query, key) pair", units=L * pairs,
                           alternatives=pairs_alternative(c, 4 * c.head_dim))
    forward = subtotal("forward", [blocks, head, rest, attention],
                       formula="B T x (2N + 4 L H Q T)")
    return Budget(source=SOURCE, url=URL, config=c,
                  scope="2N + 4 L H Q T per token, the forward third of 6N + 12 L H Q T: every "
                        "parameter of N as a matmul weight and both attention matmuls over the "
                        "full square; softmax, activations and residual adds left out",
                  items=[blocks, head, rest, attention, forward], total="forward")
