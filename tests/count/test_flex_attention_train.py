"""FlexAttention in train mode: forward and backward counted by hand from the block mask.

Per (query, key) score, as formulas/attention.py and formulas/gradients.py count SDPA's:
  forward:  q.k and p.v, D + D MACs (2 (D + D) FLOPs); the scale 1; the softmax 5
            -> 2 * (16 + 16) + 1 + 5 = 70 FLOPs at head dim D = 16;
  backward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, 2 (D + D) MACs; the softmax
            gradient 4; the scale 1 -> 2 * 64 + 4 + 1 = 133 FLOPs.
torch.utils.flop_counter counts the same contractions at 2 FLOPs per MAC (its
``sdpa_flop_count``), and in the backward a fifth, the q.k its fused kernels recompute
(``sdpa_backward_flop_count``, which its ``flex_attention_backward`` formula calls): checked below.

``flops`` are dense, every score (FlopCounterMode's convention too); the scores in the blocks the
block mask skips are also ``masked_flops``, so ``causal_effective_flops`` is the block-sparse
kernel's work. A block of Q_BLOCK x KV_BLOCK scores is visited when its mask keeps any pair.

torch's cpu kernel has no flex backward, so ``flex_attention`` refuses inputs that need a gradient
on cpu before anything is traced. torch.export traces the higher-order op on fake tensors and
runs no kernel: on a cpu-only machine the tests lift that eager guard (pytest's monkeypatch,
undone after each test); with cuda present they run on cuda as well, guard in place.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from exportflops import analyze

H, D, BLOCK = 2, 16, 128
FORWARD_FLOPS_PER_SCORE = 2 * (D + D) + 1 + 5  # 70
BACKWARD_FLOPS_PER_SCORE = 2 * 2 * (D + D) + 4 + 1  # 133

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    if request.param == "cpu":
        monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)
    return request.param


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < BLOCK)


class Attention(nn.Module):
    """Projections in, flex attention over a block mask built in forward, projection out."""

    def __init__(self, mask_mod, width: int = H * D) -> None:
        super().__init__()
        self.mask_mod = mask_mod
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        mask = create_block_mask(self.mask_mod, None, None, tokens, tokens, device=x.device,
                                 BLOCK_SIZE=BLOCK)
        q, k, v = self.qkv(x).view(batch, tokens, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        y = flex_attention(q, k, v, block_mask=mask)
        return self.out(y.transpose(1, 2).reshape(batch, tokens, width))


def flex_nodes(report, op: str):
    return [n for n in report.nodes if n.op == f"higher_order.{op}"]


# Causal, batch 2, T = 256: blocks of 128 -> a 2 x 2 grid. Block (q 0, kv 1) holds q < kv only
# and is skipped; (0, 0) and (1, 1) are partial, (1, 0) full: 3 of 4 blocks computed.
# Sliding window of 128 (0 <= q - kv < 128), T = 512: a 4 x 4 grid. Block (i, j) holds
# q - kv from 128 (i - j) - 127 to 128 (i - j) + 127, which meets [0, 128) for i - j = 0 (4
# diagonal blocks) and i - j = 1 (3 below it): 7 of 16 blocks computed, 9 skipped.
@pytest.mark.parametrize(("mask_mod", "batch", "tokens", "skipped_blocks"), [
    (causal, 2, 256, 1),
    (sliding_window, 1, 512, 16 - 7),
], ids=["causal", "sliding_window"])
def test_forward_and_backward_count_the_blocks_the_mask_keeps(device, mask_mod, batch, tokens,
                                                              skipped_blocks):
    with torch.device(device):
        model, x = Attention(mask_mod), torch.randn(batch, tokens, H * D)
    report = analyze(model, (x,), mode="train")
    scores = batch * H * tokens * tokens
    skipped = batch * H * skipped_blocks * BLOCK * BLOCK

    (forward,) = flex_nodes(report, "flex_attention")
    assert forward.cost.macs == scores * (D + D)
    assert forward.cost.flops == scores * FORWARD_FLOPS_PER_SCORE
    assert forward.cost.masked_flops == skipped * FORWARD_FLOPS_PER_SCORE
    assert forward.cost.masked_macs == skipped * (D + D)

    (backward,) = flex_nodes(report, "flex_attention_backward")
    assert backward.phase == "backward" and backward.module == ""
    assert backward.cost.macs == scores * 2 * (D + D)
    assert backward.cost.flops == scores * BACKWARD_FLOPS_PER_SCORE
    assert backward.cost.masked_flops == skipped * BACKWARD_FLOPS_PER_SCORE
    assert backward.cost.masked_macs == skipped * 2 * (D + D)

    # torch's FlopCounterMode convention, dense: 2 FLOPs per MAC, and a recomputed q.k
    # (2 * scores * D FLOPs) in the backward.
    shape = (batch, H, tokens, D)
    assert sdpa_flop_count(shape, shape, shape) == 2 * forward.cost.macs
    assert sdpa_backward_flop_count(shape, shape, shape, shape) == (
        2 * backward.cost.macs + 2 * scores * D)
    assert report.uncounted == []


class Decoder(nn.Module):
    """Two pre-norm layers of causal flex attention and a GELU MLP, between an embedding and
    an untied head."""

    def __init__(self, vocab: int = 64, width: int = H * D) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(4)])
        self.attention = nn.ModuleList([Attention(causal) for _ in range(2)])
        self.mlp = nn.ModuleList([
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(2)])
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for i in range(2):
            x = x + self.attention[i](self.norms[2 * i](x))
            x = x + self.mlp[i](self.norms[2 * i + 1](x))
        return self.head(x)


def test_a_flex_attention_decoder_leaves_nothing_uncounted(device):
    """Each layer's flex attention is counted forward and backward, and nothing else is masked:
    the report's masked work is the two layers' skipped block, (1 x 2 heads x 128 x 128)
    scores each at T = 256, forward and backward."""
    with torch.device(device):
        model, ids = Decoder(), torch.randint(0, 64, (1, 256))
    report = analyze(model, (ids,), mode="train")
    assert report.uncounted == []
    assert [n.module for n in flex_nodes(report, "flex_attention_backward")] == [
        "attention.0", "attention.1"]
    skipped = H * BLOCK * BLOCK
    assert report.forward.masked_flops == 2 * skipped * FORWARD_FLOPS_PER_SCORE
    assert report.backward.masked_flops == 2 * skipped * BACKWARD_FLOPS_PER_SCORE


class ScoreMod(nn.Module):
    """Flex attention with a score_mod over batch 1, 2 heads, 8 tokens: 2 * 8 * 8 = 128 scores."""

    def __init__(self, score_mod) -> None:
        super().__init__()
        self.score_mod = score_mod
        self.bias = nn.Parameter(torch.zeros(H))
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return flex_attention(q, k, v, score_mod=lambda *a: self.score_mod(self, *a))


SCORES = 1 * H * 8 * 8  # 128


@pytest.mark.parametrize(("score_mod", "backward_flops_per_score"), [
    # Gemma 2's soft cap 30 tanh(s / 30), differentiated: the divide's gradient (1), tanh's
    # 1 - y^2 times the gradient (3), the multiply's (1).
    (lambda m, s, b, h, q, kv: 30 * torch.tanh(s / 30), {"div": 1, "tanh_backward": 3, "mul": 1}),
    # A learned bias per head: the index's gradient adds each score's gradient into bias[h]
    # (flex_lib.zeros_and_scatter, ModIndex's backward), 1 per score.
    (lambda m, s, b, h, q, kv: s + m.bias[h], {"zeros_and_scatter": 1}),
], ids=["softcap", "learned_bias"])
def test_the_score_mod_is_differentiated_per_score(device, score_mod, backward_flops_per_score):
    with torch.device(device):
        model, x = ScoreMod(score_mod), torch.randn(1, H, 8, D)
    report = analyze(model, (x,), mode="train")
    assert report.uncounted == []
    score_mod_backward = {n.op.split(".")[1]: n.cost.flops for n in report.nodes
                          if n.phase == "backward" and ".sdpa_score0." in n.name
                          and n.cost.flops}
    assert score_mod_backward == {op: SCORES * flops
                                  for op, flops in backward_flops_per_score.items()}


def test_a_mask_that_reads_data_is_counted_dense(device):
    """A document mask compares ids that are data (an input): which blocks it skips is not in
    the graph, so the count stays dense, nothing masked, and nothing is uncounted."""
    class Documents(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(D, 3 * D)

        def forward(self, x, document):
            def same_document(b, h, q_idx, kv_idx):
                return document[q_idx] == document[kv_idx]

            mask = create_block_mask(same_document, None, None, 256, 256, device=x.device,
                                     BLOCK_SIZE=BLOCK)
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return flex_attention(q, k, v, block_mask=mask)

    with torch.device(device):
        model = Documents()
        args = (torch.randn(1, H, 256, D), torch.arange(256) // 128)
    report = analyze(model, args, mode="train")
    assert report.uncounted == []
    (backward,) = flex_nodes(report, "flex_attention_backward")
    assert backward.cost.flops == H * 256 * 256 * BACKWARD_FLOPS_PER_SCORE
    assert report.total.masked_flops == 0
