"""Hand-derived transformer FLOP budgets, one published source per module, and `compare`, which
sets a budget beside an exported graph component by component.

- `karpathy`: nanoGPT's ``transformer_sizing.ipynb``, per component;
- `kaplan`: Kaplan et al. 2020, Table 1, C_forward = 2N + 2 n_layer n_ctx d_attn per token;
- `chinchilla`: Hoffmann et al. 2022, appendix F, with embeddings, logits and softmax;
- `palm`: Chowdhery et al. 2022, appendix B, 6N + 12 L H Q T per token (MFU's numerator).

Each takes a `TransformerConfig`, built from plain numbers or with one of its ``from_*``
constructors (Hugging Face GPT-2, Llama, Mistral, Qwen2; nanoGPT; Meta's Llama params), or
read from a built model by `from_model.config_of`.
"""

from .budget import Budget, BudgetItem
from .chinchilla import chinchilla, ratio_to_6nd
from .compare import (
    DEFAULT_MAPPING,
    ROLES,
    Comparison,
    ComparisonRow,
    MappingRule,
    breakdown,
    compare,
)
from .config import ParamCounts, TransformerConfig, meta_ffn_width
from .kaplan import kaplan
from .nanogpt import NOTEBOOK_GPT2, karpathy
from .palm import mfu, model_flops_per_token, palm
from .table import comparison_table

__all__ = [
    "DEFAULT_MAPPING", "NOTEBOOK_GPT2", "ROLES", "Budget", "BudgetItem", "Comparison",
    "ComparisonRow", "MappingRule", "ParamCounts", "TransformerConfig", "breakdown",
    "chinchilla", "compare", "comparison_table", "kaplan", "karpathy", "meta_ffn_width", "mfu",
    "model_flops_per_token", "palm", "ratio_to_6nd",
]
