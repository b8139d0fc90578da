"""Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (arXiv:2001.08361), section 2.1
and Table 1: forward FLOPs per token of a decoder.

Table 1, per token, with d_attn = H hd:

1. Embed: 4 d (not in C_forward).
2. Attention QKV: 2 n_layer d 3 d_attn.
3. Attention mask: 2 n_layer n_ctx d_attn.
4. Attention project: 2 n_layer d_attn d.
5. Feedforward: 2 n_layer 2 d d_ff.
6. De-embed: 2 d n_vocab (not in C_forward).

N = 2 d n_layer (2 d_attn + d_ff) counts the blocks' weights only (no embeddings, biases or
norms), and C_forward = 2N + 2 n_layer n_ctx d_attn: steps 2 to 5. Training is about 6N per
token (backward = 2 x forward).

The attention term 2 n_layer n_ctx d_attn is half the dense count of the two attention matmuls
(PaLM's forward 4 L H Q T per token): a full T x T square for one of them, or both over the
causal half. Generalized here to grouped-query attention (keys and values of KV heads) and a
gated FFN (three d x f matrices); n_ctx is the budgeted T.
"""

from __future__ import annotations

from .budget import Budget, BudgetItem, head_alternatives, subtotal
from .config import TransformerConfig

SOURCE = "Kaplan et al. 2020, Table 1"
URL = "https://arxiv.org/abs/2001.08361"

GATHER = "a gather of table rows, no arithmetic (the graph's aten.embedding)"
DENSE_ATTENTION = ("both attention matmuls (q . k and p . v) over the full T x T square "
                   "(PaLM's 4 L H Q T per token)")


def n_params(config: TransformerConfig) -> int:
    """Kaplan's N: weights of the blocks' projections; 2 d n_layer (2 d_attn + d_ff) for
    multi-head attention and a two-matrix FFN."""
    c = config
    ffn = (3 if c.gated_ffn else 2) * c.width * c.ffn_width
    return c.layers * (c.width * (c.q_width + 2 * c.kv_width) + c.q_width * c.width + ffn)


def kaplan(config: TransformerConfig) -> Budget:
    """C_forward = 2N + 2 n_layer n_ctx d_attn per token, for every token of the call."""
    c = config
    tokens, d, L, T = c.tokens, c.width, c.layers, c.seq_len
    projections = 3 if c.gated_ffn else 2

    def per_token(name: str, per: int, formula: str, roles: list[str], **extra) -> BudgetItem:
        return BudgetItem(name=name, kind=extra.pop("kind", "matmul"), each=tokens * per,
                          repeats=1, formula=f"B T x {formula}", roles=roles, unit="token",
                          units=tokens, **extra)

    embed = per_token("embed", 4 * d, "4 d", ["embedding"], kind="other",
                      alternatives={GATHER: 0},
                      note="Table 1 lists 4 d per token for the embedding; not in C_forward")
    qkv = per_token("attention/qkv", 2 * L * d * (c.q_width + 2 * c.kv_width),
                    "2 L d (H + 2 KV) hd", ["qkv"])
    mask = per_token("attention/mask", 2 * L * T * c.q_width, "2 L n_ctx d_attn",
                     ["scores", "reduce"], alternatives={DENSE_ATTENTION: 2 * tokens * 2 * L * T
                                                         * c.q_width},
                     note="Kaplan's attention term is half the dense count of both matmuls")
    project = per_token("attention/project", 2 * L * c.q_width * d, "2 L d_attn d",
                        ["attention_out"])
    feedforward = per_token("feedforward", 2 * L * projections * d * c.ffn_width,
                            f"2 L {projections} d d_ff", ["ffn_up", "ffn_gate", "ffn_down"])
    forward = subtotal("C_forward", [qkv, mask, project, feedforward],
                       formula="B T x (2N + 2 L n_ctx d_attn)")
    de_embed = BudgetItem(name="de-embed", kind="matmul", each=2 * c.head_rows * d * c.vocab,
                          repeats=1, formula=("B T" if c.head_positions == "all" else "B")
                          + " x 2 d n_vocab", roles=["head"], unit="position",
                          units=c.head_rows, alternatives=head_alternatives(c),
                          note="Table 1 lists the de-embedding; not in C_forward")
    return Budget(source=SOURCE, url=URL, config=c,
                  scope="C_forward: the blocks' weight matmuls (2N) and half the dense "
                        "attention matmuls; embedding, de-embedding, norms, softmax, "
                        "activations and biases left out",
                  items=[qkv, mask, project, feedforward, forward, embed, de_embed],
                  total="C_forward")
