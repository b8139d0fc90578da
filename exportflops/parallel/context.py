"""Context parallelism: a causal sequence split over ``cp`` ranks that run ring attention.

An analysis on top of the single-device count, as torch's ``context_parallel``
(``torch.distributed.tensor.experimental``) lays the work out; no process group is needed.
The model is analyzed once, symbolic in ``batch`` and ``seq`` (`flops_per_batch`), and its
counts are split by how they scale (`exportflops.training.terms`):

- the terms quadratic in ``seq`` are attention: a cost per (query, key) pair, which each rank
  pays for the pairs its queries attend to under the causal mask (key position <= query
  position), counted exactly;
- everything else runs on the rank's own tokens: the count at ``seq / cp``.

Where the sequence goes: with load balancing (torch's default for causal attention,
``_RoundRobinLoadBalancer``), 2 x cp chunks and rank r holds chunks r and 2 cp - 1 - r, so every
rank attends to as many pairs; without, rank r holds the r-th of cp contiguous blocks, and the
last rank attends to the most. Each attention call becomes a ring: the rank's key/value shard
goes to the next rank cp - 1 times in the forward; in the backward the shard goes round again
(cp - 1 sends) and the key/value gradients' accumulators go round cp times, back to their
owner, in float32 (``_templated_ring_attention`` and its backward).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from ..errors import InputError
from ..records.context import ContextParallelReport, ContextRank, RingSend, SequenceChunk
from ..records.report import Report
from ..records.symbolic import Evaluator, parse_count
from ..training.per_batch import BATCH, SEQ, FlopsPerBatch, flops_per_batch
from ..training.terms import PER_DOCUMENT, StepCount, step_count

#: torch's ring backward accumulates and sends the key/value gradients in float32
#: (``_ContextParallelOptions.convert_to_f32``, True by default).
GRADIENT_DTYPE = "float32"


def analyze_context(model: torch.nn.Module, args: Any = (), kwargs: dict | None = None, *,
                    cp: int, load_balance: bool = True,
                    mode: Literal["forward", "train"] = "forward", dynamic_shapes: Any = None,
                    batch_dim: str = BATCH, seq_dim: str = SEQ,
                    formulas: Any = None) -> ContextParallelReport:
    """Every rank's work and ring traffic when the sequence of ``model``'s example is split
    over ``cp`` ranks (module docstring). The example's batch and sequence sizes are found as
    `flops_per_batch` finds them (``dynamic_shapes``, ``batch_dim`` and ``seq_dim`` name them
    yourself); the sequence must split into 2 x cp equal chunks (cp without ``load_balance``).
    """
    _check_degree(cp)
    fpb = flops_per_batch(model, args, kwargs, mode=mode, dynamic_shapes=dynamic_shapes,
                          batch_dim=batch_dim, seq_dim=seq_dim, formulas=formulas)
    return context_split(fpb, args, kwargs, cp=cp, load_balance=load_balance)


def context_split(fpb: FlopsPerBatch, args: Any = (), kwargs: dict | None = None, *, cp: int,
                  load_balance: bool = True) -> ContextParallelReport:
    """`analyze_context` from an analysis already made (``flops_per_batch``, symbolic in the
    batch and sequence), for the batch ``args``/``kwargs``: no export."""
    _check_degree(cp)
    report, batch, seq = fpb.report, fpb.batch, fpb.seq
    name, mode = report.model, report.mode
    if seq is None:
        raise InputError(f"{name}: context parallelism splits the sequence, and its example "
                         f"has none (a 2-D integer tensor of token ids, (batch, seq)): pass "
                         f"dynamic_shapes= with seq_dim= naming the sequence's Dim.")
    # The batch's own sizes (the analysis' examples double a size of 1 for export).
    sizes = fpb.step(*(args if isinstance(args, tuple) else (args,)), **(kwargs or {})).sizes
    seq_len, rows = sizes[seq], sizes[batch]
    pieces = 2 * cp if load_balance else cp
    if seq_len % pieces:
        raise InputError(f"{name}: a sequence of {seq_len} does not split into {pieces} equal "
                         f"chunks ({'2 x ' if load_balance else ''}cp = {cp}): give the example "
                         f"a sequence length that is a multiple of {pieces}.")
    local = {**sizes, seq: seq_len // cp}
    calls = [n for n in report.nodes
             if n.phase == "forward" and "scaled_dot_product" in n.op]
    if not calls:
        raise InputError(f"{name} makes no scaled_dot_product_attention call: ring attention "
                         f"replaces those calls, so there is nothing to split the sequence of.")
    counts = _phase_counts(report, batch, seq)
    per_pair = {key: _per_pair(count, sizes, batch, seq, name) for key, count in counts.items()}
    other = {key: count.at(local) - _attention_at(count, local) for key, count in counts.items()}
    ranks = []
    for rank in range(cp):
        chunks = _chunks(rank, cp, seq_len, load_balance)
        pairs = sum(_causal_pairs(c.start, c.stop) for c in chunks)
        attention = {key: value * rows * pairs for key, value in per_pair.items()}
        ranks.append(ContextRank(
            rank=rank, chunks=chunks, attention_pairs=pairs,
            attention_flops=_both(attention, "flops"), attention_macs=_both(attention, "macs"),
            other_flops=_both(other, "flops"), other_macs=_both(other, "macs"),
            backward_flops=attention["flops", "backward"] + other["flops", "backward"],
            sends=_sends(calls, rank, cp, local, mode)))
    whole = Evaluator(sizes)
    return ContextParallelReport(
        model=name, mode=mode, cp=cp, load_balanced=load_balance, batch=rows, seq_len=seq_len,
        attention_layers=len(calls), flops_per_pair=_both(per_pair, "flops"),
        macs_per_pair=_both(per_pair, "macs"),
        single_device_flops=whole.value(parse_count(report.total.flops)
                                        - parse_count(report.total.masked_flops)),
        single_device_causal=parse_count(report.total.masked_flops) != 0, ranks=ranks)


def _check_degree(cp: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 2:
        raise InputError(f"context parallelism splits the sequence over cp >= 2 ranks, got "
                         f"cp={cp!r}.")


def _phase_counts(report: Report, batch: str, seq: str) -> dict[tuple[str, str], StepCount]:
    """(field, phase) -> the count's terms, for flops and macs, forward and backward."""
    counts = {}
    for field in ("flops", "macs"):
        total, backward = (parse_count(getattr(c, field)) for c in (report.total,
                                                                    report.backward))
        counts[field, "forward"] = step_count(total - backward, batch, seq)
        counts[field, "backward"] = step_count(backward, batch, seq)
    return counts


def _both(values: dict[tuple[str, str], int], field: str) -> int:
    return values[field, "forward"] + values[field, "backward"]


def _attention_at(count: StepCount, sizes: dict[str, int]) -> int:
    """The attention terms (quadratic in the sequence) at ``sizes``."""
    values = {name: sizes[name] for name in count.names}
    return sum(g.evaluate(**values) for g in count.groups if g.scaling == PER_DOCUMENT)


def _per_pair(count: StepCount, sizes: dict[str, int], batch: str, seq: str,
              model: str) -> int:
    """The attention terms' cost of one (query, key) pair of one row: they are
    ``c * batch * seq**2``, and ``c`` is their value at batch = seq = 1."""
    degrees = {g.seq_degree for g in count.groups if g.scaling == PER_DOCUMENT}
    if degrees - {2}:
        raise InputError(f"{model}'s count has terms of degree {max(degrees)} in the sequence: "
                         f"only attention's pairs (degree 2) split over a ring.")
    return _attention_at(count, {**sizes, batch: 1, seq: 1})


def _chunks(rank: int, cp: int, seq_len: int, load_balance: bool) -> list[SequenceChunk]:
    """The positions ``rank`` holds: chunks rank and 2 cp - 1 - rank of 2 cp (torch's
    round-robin load balancer), or block rank of cp."""
    indices = (rank, 2 * cp - 1 - rank) if load_balance else (rank,)
    size = seq_len // (2 * cp if load_balance else cp)
    return [SequenceChunk(index=i, start=i * size, stop=(i + 1) * size) for i in indices]


def _causal_pairs(start: int, stop: int) -> int:
    """(i, j) pairs with ``j <= i`` for queries ``start <= i < stop`` over every key of the
    sequence: sum of i + 1, i.e. ``(stop (stop + 1) - start (start + 1)) / 2``."""
    return (stop * (stop + 1) - start * (start + 1)) // 2


def _sends(calls: list, rank: int, cp: int, local: dict[str, int], mode: str) -> list[RingSend]:
    """Per attention call: the key/value shard sent cp - 1 times in the forward; in train mode
    cp - 1 times again in the backward, and its gradients cp times (module docstring)."""
    sizes = Evaluator(local)
    peers = {"to_rank": (rank + 1) % cp, "from_rank": (rank - 1) % cp}
    sends = []
    for call in calls:
        key, value = call.inputs[1], call.inputs[2]
        elements = sum(_numel(spec.shape, sizes) for spec in (key, value))
        shard = {"module": call.module, "dtype": key.dtype,
                 "bytes": elements * _itemsize(key.dtype), **peers}
        sends.append(RingSend(phase="forward", tensors="key/value", sends=cp - 1, **shard))
        if mode == "train":
            sends.append(RingSend(phase="backward", tensors="key/value", sends=cp - 1, **shard))
            sends.append(RingSend(**{**shard, "dtype": GRADIENT_DTYPE,
                                     "bytes": elements * _itemsize(GRADIENT_DTYPE)},
                                  phase="backward", tensors="key/value gradients", sends=cp))
    return sends


def _numel(shape: list, sizes: Evaluator) -> int:
    return math.prod(sizes.value(dim) for dim in shape)


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


__all__ = ["analyze_context", "context_split"]
