"""The stacks whose formula multiplies parameter counts: torchtitan, Hugging Face's Trainer and
PaLM's MFU definition. Each reads the parameter groups (`parts.param_groups`) as its source
counts parameters, and the attention sizes from the config."""

from __future__ import annotations

from ..budgets.config import TransformerConfig
from ..budgets.palm import model_flops_per_token
from .registry import ModelFacts, NotCovered, stack

TORCHTITAN = "pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"

#: transformers' model types torchtitan has a model of, and the ``head_dims`` its
#: ``get_nparams_and_flops`` passes (the sum of the query-key and value head dims):
#: models/llama3/model.py ``2 * (dim // n_heads)``, models/qwen3/model.py ``2 * head_dim``,
#: models/deepseek_v3/model.py ``qk_nope_head_dim + qk_rope_head_dim + v_head_dim``.
TORCHTITAN_HEAD_DIMS = {
    "llama": lambda c: 2 * (c.hidden_size // c.num_attention_heads),
    "qwen3": lambda c: 2 * c.head_dim,
    "qwen3_moe": lambda c: 2 * c.head_dim,
    "deepseek_v3": lambda c: c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim,
}


def _six_n(tokens: int, **params: int) -> dict[str, int]:
    """6 FLOPs per parameter per token (2 forward, 4 backward), each part's parameters."""
    return {part: 6 * tokens * n for part, n in params.items()}


def _top_k(facts: ModelFacts) -> tuple[int, int]:
    """(experts routed to, routed experts) of an MoE config."""
    config = facts.config
    experts = getattr(config, "n_routed_experts", None) or config.num_experts
    return config.num_experts_per_tok, experts


@stack("torchtitan", tokens="padded", repository=TORCHTITAN,
       source="torchtitan/models/utils.py get_dense_model_nparams_and_flops, "
              "get_moe_model_nparams_and_flops")
def torchtitan(facts: ModelFacts) -> dict[str, int]:
    """torchtitan/models/utils.py, ``get_dense_model_nparams_and_flops`` and
    ``get_moe_model_nparams_and_flops``: 6 N + 6 L H head_dims T per token, head_dims the sum of
    the query-key and value head dims (12 L H Q T for one head dim Q); N every parameter but the
    embedding (with tied weights the embedding counts: it is the output layer's matmul), routed
    experts as ``experts * top_k // num_experts``; attention over the whole T x T square ("we do
    not account for sparsity in causal attention")."""
    config, p = facts.config, facts.params
    head_dims = TORCHTITAN_HEAD_DIMS.get(config.model_type)
    if head_dims is None:
        raise NotCovered(f"torchtitan has no model of type {config.model_type!r} (its own: "
                         f"{', '.join(TORCHTITAN_HEAD_DIMS)}); its transformers backend counts "
                         f"differently (torchtitan PR#4300)")
    tokens = facts.padded_tokens
    active = 0
    if p.experts:
        k, experts = _top_k(facts)
        active = p.experts * k // experts
    per_token_attention = 6 * config.num_hidden_layers * config.num_attention_heads \
        * head_dims(config) * facts.seq
    return {**_six_n(tokens, projections=p.projections, router=p.router, experts=active,
                     norms_and_biases=p.norms + p.biases, output_layer=p.head_width),
            "attention": tokens * per_token_attention}


@stack("hf-trainer", tokens="padded", repository="transformers 5.24",
       source="trainer.py Trainer.floating_point_ops, modeling_utils.py "
              "num_parameters(exclude_embeddings=True)")
def hf_trainer(facts: ModelFacts) -> dict[str, int]:
    """transformers' trainer.py ``Trainer.floating_point_ops`` (modeling_utils.py
    ``num_parameters(exclude_embeddings=True)``): 6 x input_ids.numel() x the parameters
    outside nn.Embedding modules: every expert,
    norms; no attention term; a tied output layer is the embedding's table, excluded with
    it; padded positions count."""
    p = facts.params
    return _six_n(facts.padded_tokens, projections=p.projections, router=p.router,
                  experts=p.experts, norms_and_biases=p.norms + p.biases,
                  output_layer=p.output_layer)


@stack("palm", tokens="padded", repository="Chowdhery et al. 2022 (PaLM), arXiv:2204.02311",
       source="appendix B; exportflops.budgets.palm")
def palm(facts: ModelFacts) -> dict[str, int]:
    """PaLM (arXiv:2204.02311) appendix B, through `exportflops.budgets.palm`'s
    ``model_flops_per_token``: 6 N + 12 L H Q T per token, N every parameter but a
    gathered-only embedding
    (`exportflops.budgets.palm`); for dense models with one head dim Q."""
    config, p = facts.config, facts.params
    if p.experts:
        raise NotCovered("PaLM's 6N is defined for a dense model: whether an MoE's N is its "
                         "active or total experts is each stack's choice (torchtitan: active; "
                         "Hugging Face's Trainer: total)")
    if hasattr(config, "kv_lora_rank"):
        raise NotCovered("PaLM's 12 L H Q T has one head dim Q; multi-latent attention's "
                         "query-key and value head dims differ")
    try:
        budget = TransformerConfig.from_llama(config, seq_len=facts.seq, batch=facts.rows)
    except ValueError as why:  # a config without a Llama-family field (GPT-2's n_inner)
        raise NotCovered(f"PaLM's attention term is read here from a Llama-family config: "
                         f"{why}") from why
    tokens = facts.padded_tokens
    return {**_six_n(tokens, projections=p.projections, norms_and_biases=p.norms + p.biases,
                     output_layer=p.head_width),
            "attention": tokens * model_flops_per_token(budget, params=0)}
