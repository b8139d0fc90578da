"""Train mode counts the same on meta as on cpu: SDPA's causal backward, derived by hand.

On meta tensors SDPA chooses its math fallback (``_fused_sdp_choice`` has no fused backend for
meta), whose backward is four plain ``bmm``s that know nothing of the causal flag; cpu chooses
``_scaled_dot_product_flash_attention_for_cpu``, whose backward carries ``is_causal``. A model
built on meta is counted as on cpu, so both report the same masked (causal-discarded) work.

The attention below: batch 1, H = 2 heads, T = 16 tokens, head dim D = 16, ``is_causal=True``.
Its backward, per (query, key) score (formulas/gradients.py, the model-FLOPs convention of PaLM's
appendix B; torch.utils.flop_counter adds a fifth contraction, the recomputed q.k):
  dV = P^T dO and dP = dO V^T : D + D MACs;  dQ = dS K and dK = dS^T Q : D + D MACs
  -> 2 * (D + D) = 64 MACs = 128 FLOPs; softmax gradient 4; the scale 1  -> 133 FLOPs per score.
Scores: H * T * T = 512. The causal mask keeps T (T + 1) / 2 = 136 of each head's 256 pairs, so
H * (256 - 136) = 240 scores are masked.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportflops import analyze

H, T, D = 2, 16, 16
WIDTH = H * D
SCORES = H * T * T  # 512
MASKED_SCORES = H * (T * T - T * (T + 1) // 2)  # 2 * (256 - 136) = 240
BACKWARD_MACS_PER_SCORE = 2 * (D + D)  # dV, dP, dQ, dK: 64
BACKWARD_FLOPS_PER_SCORE = 2 * BACKWARD_MACS_PER_SCORE + 4 + 1  # contractions, softmax, scale: 133


class CausalAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x):
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def train_report(device: str):
    with torch.device(device):
        model, x = CausalAttention(), torch.randn(1, T, WIDTH)
    return analyze(model, (x,), mode="train")


def attention_backward(report):
    return [n for n in report.nodes if n.phase == "backward"
            and "scaled_dot_product" in n.op and n.cost.macs]


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_sdpa_causal_backward_carries_the_masked_work_by_hand(device):
    (node,) = attention_backward(train_report(device))
    assert node.cost.flops == SCORES * BACKWARD_FLOPS_PER_SCORE  # 512 * 133 = 68,096
    assert node.cost.macs == SCORES * BACKWARD_MACS_PER_SCORE  # 32,768
    assert node.cost.masked_flops == MASKED_SCORES * BACKWARD_FLOPS_PER_SCORE  # 240 * 133 = 31,920
    assert node.cost.masked_macs == MASKED_SCORES * BACKWARD_MACS_PER_SCORE  # 15,360


def test_meta_and_cpu_give_the_same_train_counts():
    meta, cpu = train_report("meta"), train_report("cpu")
    assert meta.backward == cpu.backward
    assert meta.backward.causal_effective_flops == cpu.backward.causal_effective_flops
    assert meta.backward.causal_effective_flops == (
        cpu.backward.flops - MASKED_SCORES * BACKWARD_FLOPS_PER_SCORE)
    assert meta.total == cpu.total
