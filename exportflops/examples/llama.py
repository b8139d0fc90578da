"""Llama 3 as Meta's reference writes it, in plain torch.

`Llama` follows ``llama/model.py`` of meta-llama/llama3: pre-norm blocks with RMSNorm, rotary
position embeddings on queries and keys, grouped-query attention (``n_kv_heads`` key/value heads
shared by ``n_heads // n_kv_heads`` query heads each), a bias-free SwiGLU feed-forward
``w2(silu(w1(x)) * w3(x))``, and an output projection not tied to the token embedding. Module
names are the reference's (``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1``,
``norm``, ``output``), so report paths match the names in Meta's checkpoints.

Two departures, neither changing the arithmetic of a matmul:

- Rotary embeddings rotate the two halves of each head (``rotate_half``, as Hugging Face's port
  does) instead of adjacent pairs through complex numbers; the same rotation on permuted
  channels, with real ops only.
- Keys and values are expanded to every query head before one causal
  ``F.scaled_dot_product_attention`` call.
- The KV cache is passed in and returned, not kept in buffers: ``model(tokens)`` is a forward
  with no cache; ``model(tokens, [])`` the prefill, returning the logits and a cache, one
  (keys, values) pair per layer, (B, n_kv_heads, T, head_dim) each; ``model(tokens, cache)`` a
  step after ``cache``'s entries. The reference's buffers hold ``max_seq_len`` entries, but its
  attention reads the first ``start_pos + seqlen`` only: the same work as this growing cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a Llama-family decoder."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    """Key/value heads (grouped-query attention); ``n_heads`` must be a multiple of it."""
    head_dim: int
    ffn_dim: int
    """Width of the SwiGLU hidden layer (w1, w3 out; w2 in)."""
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    max_seq_len: int = 8192
    tie_embeddings: bool = False
    """Share the output projection's weight with the token embedding (Llama 3.2 1B/3B do)."""
    logits_last_only: bool = False
    """Apply the output projection to the last position only (generation); default all positions."""

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads}): each key/value head serves a whole group")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even: rotary embeddings "
                             f"rotate pairs of channels")


# Meta's params.json for each checkpoint (meta-llama/Meta-Llama-3-8B and -70B on Hugging Face,
# original/params.json) and the Llama 3 model card (context length 8k). The reference derives
# the FFN width from multiple_of and ffn_dim_multiplier (llama/model.py, FeedForward.__init__):
#   1. hidden = int(2 * (4 * dim) / 3)                     8B: 10922        70B: 21845
#   2. hidden = int(ffn_dim_multiplier * hidden), 1.3      8B: 14198        70B: 28398
#   3. round up to multiple_of (1024 for 8B, 4096 for 70B) 8B: 14336        70B: 28672
# head_dim = dim // n_heads = 128 for both.
LLAMA3_8B = LlamaConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                        head_dim=128, ffn_dim=14336, norm_eps=1e-5, rope_theta=500_000.0,
                        max_seq_len=8192)
LLAMA3_70B = LlamaConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                         head_dim=128, ffn_dim=28672, norm_eps=1e-5, rope_theta=500_000.0,
                         max_seq_len=8192)
# Llama 3.1 405B (The Llama 3 Herd of Models, Table 3: 126 layers, model dimension 16,384, FFN
# dimension 53,248, 128 heads, 8 key/value heads; 128K context): params.json's
# ffn_dim_multiplier 1.2 and multiple_of 4096 give int(1.2 * int(2 * 4 * 16384 / 3)) = 52428,
# rounded up to 53248.
LLAMA3_405B = LlamaConfig(vocab_size=128256, dim=16384, n_layers=126, n_heads=128,
                          n_kv_heads=8, head_dim=128, ffn_dim=53248, norm_eps=1e-5,
                          rope_theta=500_000.0, max_seq_len=131072)


class RotaryEmbedding(nn.Module):
    """cos and sin of each position's rotation angles, computed from the positions at each call
    (no buffer, so the module builds on ``meta`` and still computes the right values elsewhere)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(self, seq_len: int, device: torch.device,
                start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        # inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2 (RoFormer, Su et al. 2021, eq. 15)
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        inv_freq = torch.pow(self.theta, -exponents / self.head_dim)  # (hd/2,)
        positions = torch.arange(start, start + seq_len, dtype=torch.float32, device=device)
        angles = positions[:, None] * inv_freq[None, :]  # (T, hd/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, hd): one angle per rotated half
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, heads, T, hd) by the angles whose cos/sin are (T, hd)."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple:
        """The output, and the layer's keys and values (``past``'s and the new ones')."""
        B, T, _ = x.size()
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mask = None  # causal over the new tokens; one token attends to every key
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)  # (B, KV, S, hd)
            if T > 1:  # S = past + T keys: query i sees keys 0 .. past + i (reference's mask)
                mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=x.device).tril(
                    k.shape[2] - T)
        y = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v), attn_mask=mask,
                                           is_causal=past is None)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.wo(y), (k, v)

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        """(B, KV, T, hd) -> (B, H, T, hd): key/value head j serves query heads
        j*rep ... (j+1)*rep-1."""
        B, _, T, hd = kv.shape
        rep = self.n_heads // self.n_kv_heads
        return kv[:, :, None].expand(B, self.n_kv_heads, rep, T, hd).reshape(B, self.n_heads, T, hd)


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): w1 is the gate, w3 the up projection, w2 the down projection."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple:
        y, cache = self.attention(self.attention_norm(x), cos, sin, past)
        x = x + y
        return x + self.feed_forward(self.ffn_norm(x)), cache


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig = LLAMA3_8B) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.layers = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layers)])
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        """The logits; with ``cache`` (``[]`` to start one) also the cache with ``tokens``'."""
        _, T = tokens.size()
        start = cache[0][0].shape[2] if cache else 0
        cos, sin = self.rope(T, tokens.device, start)  # (T, hd) each
        x = self.tok_embeddings(tokens)  # (B, T, dim)
        updated = []
        for i, layer in enumerate(self.layers):
            past = cache[i] if cache else None
            if past is not None:  # every layer holds the same positions (one size in export)
                torch._check(past[0].shape[2] == start)
                torch._check(past[1].shape[2] == start)
            x, kv = layer(x, cos, sin, past)
            updated.append(kv)
        x = self.norm(x)
        if self.config.logits_last_only:
            x = x[:, [-1], :]
        logits = self.output(x)  # (B, T, vocab), or (B, 1, vocab) with logits_last_only
        return logits if cache is None else (logits, updated)


def llama(device: str | torch.device = "meta", config: LlamaConfig = LLAMA3_8B,
          seq_len: int | None = None, batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A Llama of ``config`` (Llama 3 8B by default) and a ``(batch, seq_len)`` token batch on
    ``device``; ``seq_len`` defaults to the config's context length."""
    seq_len = config.max_seq_len if seq_len is None else seq_len
    if seq_len > config.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the config's context length "
                         f"{config.max_seq_len}; pass a config with a larger max_seq_len")
    with torch.device(device):
        model = Llama(config).eval()
        tokens = torch.zeros((batch, seq_len), dtype=torch.long)
    return model, (tokens,)
