"""Every SDPA kernel's backward formula keeps the query/key head dim apart from the value's.

MLA (DeepSeek-V3) attends with E_qk = qk_nope + qk_rope = 24 and E_v = 16. torch's
``sdpa_backward_flop_count`` counts five bmms, 2 FLOPs per MAC: the q.k a fused kernel recomputes
(L * S * E_qk MACs per slice), dP = dO V^T and dV = P^T dO (L * S * E_v each), dQ = dS K and
dK = dS^T Q (L * S * E_qk each). exportflops counts the four gradient contractions
(formulas/gradients.py), so its MACs are torch's FLOPs / 2 less the recompute.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import sdpa_backward_flop_count

from exportflops.formulas import FORMULAS, OpCall, TensorMeta

aten = torch.ops.aten
B, H, L, S, E_QK, E_V = 2, 4, 16, 12, 24, 16

HEADS_FIRST = [aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
               aten._scaled_dot_product_flash_attention_backward.default,
               aten._scaled_dot_product_efficient_attention_backward.default,
               aten._scaled_dot_product_cudnn_attention_backward.default,
               aten._scaled_dot_product_fused_attention_overrideable_backward.default]
SEQUENCE_FIRST = [aten._flash_attention_backward.default,
                  aten._efficient_attention_backward.default]


def _tensors(heads_first: bool) -> dict[str, TensorMeta]:
    def meta(seq, dim):
        return TensorMeta((B, H, seq, dim) if heads_first else (B, seq, H, dim), torch.float16)
    return {"grad_out": meta(L, E_V), "query": meta(L, E_QK), "key": meta(S, E_QK),
            "value": meta(S, E_V)}


@pytest.mark.parametrize("op", HEADS_FIRST + SEQUENCE_FIRST, ids=str)
def test_backward_macs_are_torch_s_five_bmms_less_the_recomputed_scores(op):
    args = {**_tensors(op in HEADS_FIRST), "is_causal": False, "dropout_p": 0.0}
    cost = FORMULAS.lookup(op).formula(OpCall(op, args, ()))
    torch_flops = sdpa_backward_flop_count((B, H, L, E_V), (B, H, L, E_QK), (B, H, S, E_QK),
                                           (B, H, S, E_V))
    recomputed_scores_macs = B * H * L * S * E_QK
    assert cost.macs == torch_flops // 2 - recomputed_scores_macs
    assert cost.macs == B * H * L * S * (2 * E_V + 2 * E_QK)  # 8 * 192 * 80 = 122,880
