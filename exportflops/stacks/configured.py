"""The stacks whose formula is written on config fields: Megatron-LM, verl and TRL.

Each function transcribes its source's arithmetic, split into `parts.PARTS` where the source
writes one sum; the parts add up to the source's value.
"""

from __future__ import annotations

from .registry import ModelFacts, NotCovered, stack

MEGATRON = "NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553"
VERL = "volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7"
TRL = "huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8"

#: Megatron's 3 (forward, weight gradient, input gradient) x 2 (a multiply-add).
GEMM = 6


def _moe_layers(config) -> list[bool]:
    """Which layers are MoE, as transformers builds them (Megatron's ``moe_layer_freq``)."""
    layers = config.num_hidden_layers
    if hasattr(config, "first_k_dense_replace"):  # DeepSeek-V3
        return [i >= config.first_k_dense_replace for i in range(layers)]
    if hasattr(config, "decoder_sparse_step"):  # Qwen3-MoE
        only = set(config.mlp_only_layers or ())
        return [i not in only and (i + 1) % config.decoder_sparse_step == 0
                for i in range(layers)]
    return [False] * layers


def _megatron_attention(config, tokens: int, squares: int) -> dict[str, int]:
    """``standard_self_attn_term`` x tokens and ``standard_self_attn_core_term`` x sum(L^2),
    every layer; MLA's ``+ 1`` (its q and kv norm weights) as norms."""
    d, h, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    if hasattr(config, "kv_lora_rank"):  # multi_latent_attention
        qk, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        q_lora, kv_lora = config.q_lora_rank, config.kv_lora_rank
        q_term = d * h * (qk + rope) if q_lora is None else q_lora * (d + h * (qk + rope))
        linear = q_term + kv_lora * (d + h * (qk + v)) + d * rope + h * v * d
        norms = (0 if q_lora is None else q_lora) + kv_lora
        core = 3 * h * (qk + rope + v)  # GEMM x (h (qk + rope) / 2 + h v / 2)
    else:
        kv_channels = getattr(config, "head_dim", None) or d // h
        query = kv_channels * h
        key = kv_channels * config.num_key_value_heads
        linear, norms = d * (query + 2 * key) + query * d, 0
        core = GEMM * query  # / 2 for the causal mask, x 2 for q.k and p.v
    return {"projections": layers * tokens * GEMM * linear,
            "norms_and_biases": layers * tokens * GEMM * norms,
            "attention": layers * squares * core}


@stack("megatron-lm", tokens="padded", repository=MEGATRON,
       source="megatron/training/training.py num_floating_point_operations "
              "(transformer_flops)")
def megatron(facts: ModelFacts) -> dict[str, int]:
    """megatron/training/training.py ``num_floating_point_operations`` (its ``transformer_flops``):
    every GEMM 3 x 2 x its weights per token: SwiGLU MLPs (3 matrices), routed experts at
    ``moe_router_topk``, shared experts, the logit layer at the vocabulary; the router left out;
    attention over the causal half (``/ 2``) of sum(L^2). Read from a transformers config as
    Megatron's converters set its arguments (``padded_vocab_size`` = the config's vocabulary, no
    MTP layers); the BSHD defaults: B x T tokens, B T^2 squares."""
    config = facts.config
    if not hasattr(config, "intermediate_size"):
        raise NotCovered(f"Megatron-LM's arguments are read here as its converters set them "
                         f"from a Llama-family config (ffn_hidden_size = intermediate_size), "
                         f"which {type(config).__name__} is not")
    tokens, squares = facts.padded_tokens, facts.rows * facts.seq ** 2
    moe = _moe_layers(config)
    d, ffn = config.hidden_size, config.intermediate_size
    dense_mlp = GEMM * d * ffn * 3 * moe.count(False)
    experts = shared = 0
    if any(moe):
        moe_ffn = config.moe_intermediate_size
        experts = GEMM * d * moe_ffn * config.num_experts_per_tok * 3 * moe.count(True)
        shared_size = moe_ffn * (getattr(config, "n_shared_experts", None) or 0)
        shared = GEMM * d * shared_size * 3 * moe.count(True)
    parts = _megatron_attention(config, tokens, squares)
    parts["projections"] += tokens * (dense_mlp + shared)
    parts["experts"] = tokens * experts
    parts["output_layer"] = tokens * GEMM * d * config.vocab_size
    return parts


#: verl's ``ESTIMATE_FUNC`` (verl/utils/flops_counter.py): model type -> its function, for
#: the three transcribed here; the other types it lists are not transcribed yet.
VERL_TRANSCRIBED = {"qwen2": "qwen2", "llama": "qwen2", "qwen3": "qwen2", "mistral": "qwen2",
                    "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen2_moe",
                    "deepseek_v3": "deepseek_v3"}
VERL_LISTED = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "minicpmv", "minicpmo",
               "gemma3_text", "seed_oss", "apertus", "glm4v", "gpt_oss", "mimo"}


@stack("verl", tokens="real", repository=VERL,
       source="verl/utils/flops_counter.py FlopsCounter.estimate_flops, _estimate_qwen2_flops, "
              "_estimate_qwen2_moe_flops, _estimate_deepseek_v3_flops")
def verl(facts: ModelFacts) -> dict[str, int]:
    """verl/utils/flops_counter.py ``_estimate_qwen2_flops``, ``_estimate_qwen2_moe_flops``,
    ``_estimate_deepseek_v3_flops`` by ``ESTIMATE_FUNC``: 6 x tokens x (projection weights +
    embedding and output layer, V d each, tied or not)
    + attention over the causal half of sum(L^2), L each row's tokens without padding."""
    config = facts.config
    kind = VERL_TRANSCRIBED.get(config.model_type)
    if kind is None:
        if config.model_type in VERL_LISTED:
            raise NotCovered(f"verl has a formula for {config.model_type!r} that exportflops "
                             f"does not transcribe yet")
        raise NotCovered(f"verl's FlopsCounter has no formula for model_type "
                         f"{config.model_type!r}: it logs MFU 0 (_estimate_unknown_flops)")
    tokens, squares = facts.real_tokens, sum(n * n for n in facts.lengths)
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    h = config.num_attention_heads
    parts = {"embedding": GEMM * tokens * vocab * d, "output_layer": GEMM * tokens * vocab * d}
    if kind == "deepseek_v3":
        return {**parts, **_verl_deepseek_v3(config, tokens, squares)}
    head_dim = getattr(config, "head_dim", d // h)
    attn = d * (2 * h * head_dim + 2 * config.num_key_value_heads * head_dim)
    if kind == "qwen2":
        mlp = {"projections": GEMM * tokens * layers * (attn + 3 * d * config.intermediate_size)}
    else:  # every layer MoE, no shared expert
        mlp = {"projections": GEMM * tokens * layers * attn,
               "experts": GEMM * tokens * layers * 3 * d * config.num_experts_per_tok
               * config.moe_intermediate_size,
               "router": GEMM * tokens * layers * d * config.num_experts}
    return {**parts, **mlp, "attention": GEMM * squares * head_dim * h * layers}


def _verl_deepseek_v3(config, tokens: int, squares: int) -> dict[str, int]:
    d, h, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    moe_layers = layers - config.first_k_dense_replace
    q_head = config.qk_nope_head_dim + config.qk_rope_head_dim
    q_lora = config.q_lora_rank
    attn = d * h * q_head if q_lora is None else d * q_lora + h * q_head * q_lora
    attn += d * (config.kv_lora_rank + config.qk_rope_head_dim)
    attn += h * (q_head - config.qk_rope_head_dim + config.v_head_dim) * config.kv_lora_rank
    attn += h * config.v_head_dim * d
    moe_mlp = d * config.moe_intermediate_size * 3
    return {
        "projections": GEMM * tokens * (attn * layers
                                        + moe_mlp * config.n_shared_experts * moe_layers
                                        + d * config.intermediate_size * 3
                                        * config.first_k_dense_replace),
        "experts": GEMM * tokens * moe_mlp * config.num_experts_per_tok * moe_layers,
        "router": GEMM * tokens * d * config.n_routed_experts * moe_layers,
        "attention": 3 * squares * layers * (q_head + config.v_head_dim) * h,
    }


@stack("trl", tokens="real", repository=TRL,
       source="trl/trainer/utils.py compute_flops_per_token")
def trl(facts: ModelFacts) -> dict[str, int]:
    """trl/trainer/utils.py ``compute_flops_per_token``: 3 x the forward per token: Q/K/V/O
    projections, attention over the full sequence
    (non-causal), SwiGLU MLPs or top-k experts and the router, the embedding as a V x h
    matmul, the output layer unless tied; per token at the padded length T, times the
    tokens of ``attention_mask``. Fields are read in TRL's order, so a config lacking one is
    `NotCovered` where TRL raises."""
    name = "compute_flops_per_token"
    h = facts.field("hidden_size", "TRL", name)
    layers = facts.field("num_hidden_layers", "TRL", name)
    vocab = facts.field("vocab_size", "TRL", name)
    heads = facts.field("num_attention_heads", "TRL", name)
    kv_heads = facts.field("num_key_value_heads", "TRL", name)
    head_dim = facts.field("head_dim", "TRL", name)
    projection = 2 * h * (heads * head_dim + 2 * kv_heads * head_dim) + 2 * heads * head_dim * h
    attention = 2 * 2 * heads * head_dim * facts.seq
    per_token = {"projections": layers * projection, "attention": layers * attention}
    top_k = getattr(facts.config, "num_experts_per_tok", None)
    if top_k is None:
        per_token["projections"] += layers * 2 * 3 * h * facts.field("intermediate_size", "TRL",
                                                                     name)
    else:
        experts = facts.field("num_local_experts", "TRL", name)  # transformers >= 5.1
        moe_ffn = facts.field("moe_intermediate_size", "TRL", name)
        dense_ffn = facts.field("intermediate_size", "TRL", name)
        step = facts.field("decoder_sparse_step", "TRL", name)
        moe = sum(1 for i in range(layers) if i % step == 0)
        per_token["experts"] = moe * top_k * 2 * 3 * h * moe_ffn
        per_token["router"] = moe * 2 * h * experts
        per_token["projections"] += (layers - moe) * 2 * 3 * h * dense_ffn
    per_token["embedding"] = 2 * vocab * h
    per_token["output_layer"] = 0 if facts.config.tie_word_embeddings else 2 * vocab * h
    return {part: 3 * value * facts.real_tokens for part, value in per_token.items()}
