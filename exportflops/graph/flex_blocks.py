"""The (query, key) pairs a flex attention call skips: those in the blocks its block mask drops.

FlexAttention's fused kernels visit a (Q_BLOCK_SIZE x KV_BLOCK_SIZE) block of scores only when
its block mask lists it (partial or full), and a block is listed when its ``mask_mod`` keeps any
pair of it (``create_block_mask``). The block mask's tensors are data the graph computes; its
``mask_mod`` is a subgraph of the call, so the skipped blocks follow from evaluating that
subgraph over every (query, key) index, as ``create_block_mask`` does. That is possible when the
sizes are concrete (and below `MAX_EVALUATED`) and the ``mask_mod`` reads no tensor (a document
mask's ids are data); otherwise nothing is reported skipped and the count stays dense.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx
from torch.nn.attention.flex_attention import create_mask

from .opcall import OpCall
from ..torch_internals import HigherOrderOperator

#: Mask elements evaluated at once (a chunk of whole query blocks): bounds the memory at 16 MiB.
CHUNK_ELEMENTS = 1 << 24
#: Beyond this many (batch, head, query, key) evaluations the mask is not evaluated: 2^28 take
#: about 2 s on one core, 2^32 (a 65,536-token square) about half a minute.
MAX_EVALUATED = 1 << 32


def skipped_pairs(node: torch.fx.Node) -> int | None:
    """Pairs, summed over the query's batch and heads, in the blocks ``node``'s block mask
    skips; None when they cannot be told from the graph (sizes dynamic or too large, a
    ``mask_mod`` that reads tensors, one that does not run on cpu)."""
    query, key = (a.meta.get("val") for a in node.args[:2])
    block_mask, mask_buffers = node.args[4], node.args[8]
    mask_graph = _subgraph(node, block_mask[-1])
    counts = block_mask[2].meta.get("val") if isinstance(block_mask[2], torch.fx.Node) else None
    if mask_graph is None or mask_buffers or counts is None:
        return None
    sizes = (*counts.shape[:2], query.shape[-2], key.shape[-2], *block_mask[-3:-1],
             math.prod(query.shape[:-2]))
    if not all(isinstance(s, int) for s in sizes):
        return None
    mask_batch, mask_heads, q_len, kv_len, q_block, kv_block, slices = sizes
    if mask_batch * mask_heads * q_len * kv_len > MAX_EVALUATED:
        return None
    shape = (mask_batch, mask_heads, q_len, kv_len, q_block, kv_block)
    try:
        if any(n.op == "get_attr" for n in mask_graph.graph.nodes):  # constants: by value
            kept = _kept_pairs(mask_graph, *shape)
        else:  # every layer's mask is its own subgraph, mostly of the same code
            kept = _kept_pairs_of_code(_MaskCode(mask_graph.code, mask_graph), *shape)
    except Exception:  # any user mask_mod may refuse cpu tensors; the count stays dense
        return None
    # A mask of batch or heads 1 is broadcast over the query's (create_block_mask(B=None)).
    return (mask_batch * mask_heads * q_len * kv_len - kept) * slices // (mask_batch * mask_heads)


def _subgraph(node: torch.fx.Node, arg: Any) -> torch.fx.GraphModule | None:
    if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
        return None
    subgraph = getattr(node.graph.owning_module, arg.target, None)
    return subgraph if isinstance(subgraph, torch.fx.GraphModule) else None


@dataclass(frozen=True)
class _MaskCode:
    """A ``mask_mod`` subgraph that reads no constant, equal to another of the same code."""

    code: str
    module: torch.fx.GraphModule = field(compare=False, hash=False)


@functools.lru_cache(maxsize=16)
def _kept_pairs_of_code(mask: _MaskCode, *shape: int) -> int:
    return _kept_pairs(mask.module, *shape)


def _kept_pairs(mask_mod, batch: int, heads: int, q_len: int, kv_len: int, q_block: int,
                kv_block: int) -> int:
    """Pairs in the blocks that keep any pair, over all (batch, head) slices of the mask."""
    rows = max(q_block, CHUNK_ELEMENTS // max(1, batch * heads * kv_len) // q_block * q_block)
    kept = 0
    with torch.no_grad():
        for start in range(0, q_len, rows):
            length = min(rows, q_len - start)
            mask = create_mask(lambda b, h, q, kv: mask_mod(b, h, q + start, kv),
                               batch, heads, length, kv_len, device="cpu")
            kept += _kept_in(mask, q_block, kv_block)
    return kept


def _kept_in(mask: torch.Tensor, q_block: int, kv_block: int) -> int:
    """Pairs of the blocks of ``mask`` (batch, heads, q, kv) with any pair kept; a ragged last
    block holds only its real rows and columns."""
    batch, heads, q_len, kv_len = mask.shape
    q_blocks, kv_blocks = -(-q_len // q_block), -(-kv_len // kv_block)
    padded = torch.nn.functional.pad(mask, (0, kv_blocks * kv_block - kv_len,
                                            0, q_blocks * q_block - q_len))
    blocks = padded.view(batch, heads, q_blocks, q_block, kv_blocks, kv_block).any(dim=(3, 5))
    rows = torch.full((q_blocks,), q_block)
    rows[-1] = q_len - (q_blocks - 1) * q_block
    cols = torch.full((kv_blocks,), kv_block)
    cols[-1] = kv_len - (kv_blocks - 1) * kv_block
    return int((blocks * (rows[:, None] * cols[None, :])).sum())


def with_skipped_pairs(node: torch.fx.Node, call: OpCall) -> OpCall:
    """A flex attention call with ``skipped_pairs`` among its arguments (`skipped_pairs`), for
    its formula and its backward's; any other call as it is."""
    if not (isinstance(node.target, HigherOrderOperator)
            and node.target.name() == "flex_attention"):
        return call
    return replace(call, args={**call.args, "skipped_pairs": skipped_pairs(node)})
