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
owner, in float32 (``_templated_ring_attention`` and its backward). The shard is the key and
value the eager attention call receives, which torch's ``context_parallel`` wraps: where a
transformers model's graph repeats grouped-query heads that eager passes as they are, the call's
``eager_inputs`` (`exportflops.graph.eager_heads`).

Inside FSDP2 (``fsdp=F``, as torchtitan lays it out): the world is F x cp ranks, ``cp``
innermost (``ParallelDims.build_mesh`` unflattens the world into ``("pp", "batch", "cp",
"tp")``), so global rank r is rank ``r mod cp`` of the ring of ranks ``cp x (r div cp)`` ..
``cp x (r div cp) + cp - 1``, which share one sequence, and F such rings each run their own
batch. FSDP2 shards the parameters over all F x cp ranks (torchtitan's ``fsdp`` mesh, once
``dp_shard_cp``: ``dp_shard`` and ``cp`` flattened; ``apply_fsdp`` shards each block, then the
root). A rank's FLOPs and ring traffic are its ring rank's (FSDP2 changes no FLOPs); it adds
FSDP2's all-gathers (forward, again in the backward) and gradient reduce-scatters, traced from
real FSDP2 on a fake copy of the model (`exportflops.parallel.fsdp_trace`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch

from ...errors import InputError
from ...records.collectives import Collective
from ...records.context import ContextParallelReport, ContextRank, RingSend, SequenceChunk
from ...records.report import Report
from ...records.symbolic import Evaluator, parse_count
from ...training.per_batch import BATCH, SEQ, FlopsPerBatch, flops_per_batch
from ...training.terms import PER_DOCUMENT, StepCount, step_count
from ..fsdp_trace import traced_fsdp_collectives
from ..layout import Layout

#: torch's ring backward accumulates and sends the key/value gradients in float32
#: (``_ContextParallelOptions.convert_to_f32``, True by default).
GRADIENT_DTYPE = "float32"


def count_context(model: torch.nn.Module, args: Any = (), kwargs: dict | None = None, *,
                    cp: int, fsdp: int | None = None, load_balance: bool = True,
                    mode: Literal["forward", "train"] = "forward", dynamic_shapes: Any = None,
                    batch_dim: str = BATCH, seq_dim: str = SEQ,
                    formulas: Any = None) -> ContextParallelReport:
    """Every rank's work and ring traffic when the sequence of ``model``'s example is split
    over ``cp`` ranks (module docstring). The example's batch and sequence sizes are found as
    `flops_per_batch` finds them (``dynamic_shapes``, ``batch_dim`` and ``seq_dim`` name them
    yourself); the sequence must split into 2 x cp equal chunks (cp without ``load_balance``).
    ``fsdp``: the rings sit inside FSDP2 over ``fsdp`` x ``cp`` ranks (torchtitan's layout):
    every one of those ranks is reported, with FSDP2's collectives traced on a fake copy of
    ``model`` (`fsdp_collectives`).
    """
    _check_degree(cp, fsdp)
    fpb = flops_per_batch(model, args, kwargs, mode=mode, dynamic_shapes=dynamic_shapes,
                          batch_dim=batch_dim, seq_dim=seq_dim, formulas=formulas)
    # The split's checks first: the FSDP2 trace is the costly part.
    record = context_split(fpb, args, kwargs, cp=cp, load_balance=load_balance)
    if fsdp is None:
        return record
    return context_split(fpb, args, kwargs, cp=cp, load_balance=load_balance, fsdp=fsdp,
                         fsdp_collectives=fsdp_collectives(model, args, kwargs, cp=cp,
                                                           fsdp=fsdp, mode=mode))


def fsdp_collectives(model: torch.nn.Module, args: Any = (), kwargs: dict | None = None, *,
                     cp: int, fsdp: int, mode: str = "forward") -> list[Collective]:
    """FSDP2's all-gathers and reduce-scatters of one of ``fsdp`` x ``cp`` ranks sharding
    ``model``'s parameters (each block, then the root; ``mesh_dim`` ``fsdp``), in the order the
    rank issues them, the same sizes on every rank. ``model`` and its inputs may be on meta: a
    fake copy is traced."""
    _check_degree(cp, fsdp)
    return traced_fsdp_collectives(model, args if isinstance(args, tuple) else (args,), kwargs,
                                   world=fsdp * cp, mode=mode)


class RingWork(NamedTuple):
    """What each place of a ring does: per (field, phase) (``("flops", "forward")``), the cost
    of one (query, key) pair of one row, which it pays for the causal pairs of its chunks
    (``per_pair``), and the rest of its work on its share of the sequence (``other``); and
    the key/value shards it sends round the ring (``sends``, peers as rank 0's)."""

    per_pair: dict[tuple[str, str], int]
    other: dict[tuple[str, str], int]
    sends: list[RingSend]


def context_split(fpb: FlopsPerBatch, args: Any = (), kwargs: dict | None = None, *, cp: int,
                  load_balance: bool = True, fsdp: int | None = None,
                  fsdp_collectives: list[Collective] = (), tp: int | None = None,
                  tp_collectives: list[Collective] = (),
                  work: RingWork | None = None) -> ContextParallelReport:
    """`analyze_context` from an analysis already made (``flops_per_batch``, symbolic in the
    batch and sequence), for the batch ``args``/``kwargs``: no export. With ``fsdp``, the
    FSDP2 collectives of one rank (`fsdp_collectives`), the same sizes on every rank. With
    ``tp``, each place of the ring runs its tensor-parallel rank: ``work`` is that rank's
    (`exportflops.parallel.context.tp.tensor_parallel_work`), ``tp_collectives`` its
    collectives over the tp ranks; without ``work``, the place's share of the symbolic count."""
    _check_degree(cp, fsdp)
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
    if work is None:
        work = _symbolic_work(report, calls, sizes, local, batch, seq, cp)
    ring = ring_ranks(work, rows=rows, cp=cp, seq_len=seq_len, load_balance=load_balance)
    ranks = mesh_ranks(ring, Layout(fsdp=fsdp or 1, cp=cp, tp=tp or 1))
    whole = Evaluator(sizes)
    return ContextParallelReport(
        model=name, mode=mode, cp=cp, fsdp=fsdp, fsdp_collectives=list(fsdp_collectives),
        tp=tp, tp_collectives=list(tp_collectives),
        load_balanced=load_balance, batch=rows, seq_len=seq_len,
        attention_layers=len(calls), flops_per_pair=_both(work.per_pair, "flops"),
        macs_per_pair=_both(work.per_pair, "macs"),
        single_device_flops=whole.value(parse_count(report.total.flops)
                                        - parse_count(report.total.masked_flops)),
        single_device_causal=parse_count(report.total.masked_flops) != 0, ranks=ranks)


def _symbolic_work(report: Report, calls: list, sizes: dict[str, int], local: dict[str, int],
                   batch: str, seq: str, cp: int) -> RingWork:
    """A ring place's work from the symbolic count: its attention terms' cost per pair, the
    rest at its share of the sequence (``local``), its key/value shards at that share."""
    counts = _phase_counts(report, batch, seq)
    per_pair = {key: _per_pair(count, sizes, batch, seq, report.model)
                for key, count in counts.items()}
    other = {key: count.at(local) - _attention_at(count, local) for key, count in counts.items()}
    return RingWork(per_pair, other, ring_sends(calls, local, report.mode, cp))


def _check_degree(cp: int, fsdp: int | None = None) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 2:
        raise InputError(f"context parallelism splits the sequence over cp >= 2 ranks, got "
                         f"cp={cp!r}.")
    if fsdp is not None and (isinstance(fsdp, bool) or not isinstance(fsdp, int) or fsdp < 1):
        raise InputError(f"context parallelism inside FSDP2 takes fsdp, the rings of cp ranks "
                         f"(each running its own batch), as an int >= 1, got fsdp={fsdp!r}.")


def ring_ranks(work: RingWork, *, rows: int, cp: int, seq_len: int,
               load_balance: bool) -> list[ContextRank]:
    """The ranks of one ring, 0 .. cp - 1, each doing ``work`` (`RingWork`) on the ``rows``
    rows of its chunks (peers set by `mesh_ranks`)."""
    ring = []
    per_pair, other, sends = work
    for rank in range(cp):
        chunks = _chunks(rank, cp, seq_len, load_balance)
        pairs = sum(_causal_pairs(c.start, c.stop) for c in chunks)
        attention = {key: value * rows * pairs for key, value in per_pair.items()}
        ring.append(ContextRank(
            rank=rank, cp_rank=rank, chunks=chunks, attention_pairs=pairs,
            attention_flops=_both(attention, "flops"), attention_macs=_both(attention, "macs"),
            other_flops=_both(other, "flops"), other_macs=_both(other, "macs"),
            backward_flops=attention["flops", "backward"] + other["flops", "backward"],
            sends=sends))
    return ring


def mesh_ranks(ring: list[ContextRank], layout: Layout) -> list[ContextRank]:
    """The ranks of ``layout``'s mesh (fsdp, cp, tp), tp innermost (torchtitan's): each does the
    work of its ``cp`` place on ``ring`` (`ring_ranks`)."""
    return [_placed(ring, rank, layout) for rank in range(layout.world_size)]


def _placed(ring: list[ContextRank], rank: int, layout: Layout) -> ContextRank:
    """``rank``'s place on ``ring`` as global ``rank``: its sends go to the next rank of its own
    ring (`Layout.group` along ``cp``) and come from the previous."""
    place, peers_on_ring = layout.coordinates(rank)["cp"], layout.group(rank, "cp")
    ring_rank, cp = ring[place], len(ring)
    peers = {"to_rank": peers_on_ring[(place + 1) % cp],
             "from_rank": peers_on_ring[(place - 1) % cp]}
    # A rank's view of its ring place's work, shared by the place's ranks: its own rank, peers.
    return ring_rank.model_copy(update={
        "rank": rank, "sends": [s.model_copy(update=peers) for s in ring_rank.sends]})


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


def ring_sends(calls: list, local: dict[str, int], mode: str, cp: int) -> list[RingSend]:
    """Per attention call (its node, the key and value its inputs 1 and 2 at the sizes
    ``local``, as an eager run passes them where the graph repeats their heads: the call's
    ``eager_inputs``): the key/value shard sent cp - 1 times in the forward; in train mode
    cp - 1 times again in the backward, and its gradients cp times (module docstring). Peers
    as rank 0's: `mesh_ranks` sets each rank's."""
    sizes = Evaluator(local)
    peers = {"to_rank": 1 % cp, "from_rank": (-1) % cp}
    sends = []
    for call in calls:
        # torch's ring sends what the eager call receives (its SDPA hook wraps that call).
        key, value = (call.eager_inputs or call.inputs)[1:3]
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


__all__ = ["RingWork", "count_context", "context_split", "fsdp_collectives", "mesh_ranks",
           "ring_ranks", "ring_sends"]
