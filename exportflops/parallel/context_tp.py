"""Context parallelism with tensor parallelism: each rank of a ring runs its tensor-parallel rank
of the model on the ring's share of the sequence.

The layout is torchtitan's (``ParallelDims.build_mesh`` unflattens the world into ``("pp",
"batch", "cp", "tp")``): tp innermost, so global rank r is tensor-parallel rank ``r mod tp`` at
place ``(r div tp) mod cp`` of its ring, whose other ranks are ``tp`` apart. FSDP2, when it
shards too, shards over the ``batch`` and ``cp`` ranks flattened (``fsdp x cp``).

A tensor-parallel rank is captured at fixed sizes (`exportflops.capture.dtensor`), so its count
is read at four lengths of its own sequence, ``L``, ``L - u``, ``L - 2u`` and ``L - 3u``
(``L = seq / cp``; ``u = tp`` keeps the length a multiple of tp, as a sequence-parallel plan
needs). Each op's cost is a polynomial in the sequence, so the rank's count is
``A L**2 + B L + C``: the second difference of the first three gives ``A`` exactly, and the
third difference of all four must be 0 (no term of a higher degree), or the split is refused.
``A`` is the rank's cost of every (query, key) pair over its heads, which ring attention makes
each rank pay for the causal pairs of its chunks, as without tensor parallelism
(`exportflops.parallel.context`); the rest is its count at ``L`` less ``A L**2``. The key and
value shards it sends round the ring are the inputs of its attention calls at ``L`` (its own
heads), and its collectives are those of its count at ``L``: the plan's, and FSDP2's.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from ..errors import InputError
from ..records.context import ContextParallelReport
from ..records.report import Report
from ..records.symbolic import parse_count
from .context import placed, ring_ranks, ring_sends

#: The lengths of the rank's sequence counted: L - k u for these k.
_STEPS = range(4)


def fit_lengths(record: ContextParallelReport, tp: int) -> list[int]:
    """The lengths of one rank's sequence its tensor-parallel count is read at: ``L - k tp``,
    ``L = seq / cp``, for k = 0 .. 3 (module docstring)."""
    local = record.seq_len // record.cp
    if local % tp or local <= 3 * tp:
        raise InputError(f"{record.model}: each rank of a ring of {record.cp} holds "
                         f"{local} positions, which tp {tp} must divide (a sequence-parallel "
                         f"plan splits them) and which must exceed 3 x tp (the count is read "
                         f"at {local} less 0 .. 3 x tp positions): give the example a sequence "
                         f"that is a multiple of {record.cp * tp} and at least "
                         f"{record.cp * 4 * tp} long.")
    return [local - k * tp for k in _STEPS]


def with_tensor_parallel(record: ContextParallelReport, rank_at: Callable[[int], Report], *,
                         tp: int, fsdp: int | None = None) -> ContextParallelReport:
    """``record`` (`context_split` of the single-device analysis) on the mesh (fsdp, cp, tp):
    every rank's work and ring traffic as its tensor-parallel rank's, ``rank_at(length)`` being
    that rank's report on ``length`` positions of each row (with ``fsdp``, sharded by FSDP2
    over ``fsdp x cp`` ranks too), read at `fit_lengths` (module docstring)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"{record.model}: tp must be an int >= 1, got {tp!r}.")
    lengths = fit_lengths(record, tp)
    reports = [rank_at(length) for length in lengths]
    per_pair, other = {}, {}
    for field in ("flops", "macs"):
        for phase in ("forward", "backward"):
            counts = [_count(report, field, phase) for report in reports]
            pair, rest = _quadratic(counts, lengths, record, f"{phase} {field}")
            per_pair[field, phase], other[field, phase] = pair, rest
    local = reports[0]
    calls = [n for n in local.nodes if n.phase == "forward" and "scaled_dot_product" in n.op]
    if len(calls) != record.attention_layers:
        raise InputError(f"{record.model}: its tensor-parallel rank makes {len(calls)} "
                         f"scaled_dot_product_attention calls where the model makes "
                         f"{record.attention_layers}: ring attention replaces each call, so "
                         f"the rank's must be kept whole (build the model on a device whose "
                         f"attention kernel takes the call, not its math decomposition).")
    ring = ring_ranks(per_pair, other, ring_sends(calls, {}, record.mode, record.cp),
                      rows=record.batch, cp=record.cp, seq_len=record.seq_len,
                      load_balance=record.load_balanced)
    world = (fsdp or 1) * record.cp * tp
    collectives = local.collectives
    return record.model_copy(update={
        "tp": tp, "fsdp": fsdp,
        "fsdp_collectives": [c for c in collectives if c.mesh_dim == "fsdp"],
        "tp_collectives": [c for c in collectives if c.mesh_dim != "fsdp"],
        "flops_per_pair": per_pair["flops", "forward"] + per_pair["flops", "backward"],
        "macs_per_pair": per_pair["macs", "forward"] + per_pair["macs", "backward"],
        "ranks": [placed(ring[rank // tp % record.cp], rank, record.cp, tp)
                  for rank in range(world)]})


def _count(report: Report, field: str, phase: str) -> int:
    total, backward = (int(parse_count(getattr(c, field)))
                       for c in (report.total, report.backward))
    return backward if phase == "backward" else total - backward


def _quadratic(counts: list[int], lengths: list[int], record: ContextParallelReport,
               what: str) -> tuple[int, int]:
    """(the cost of one (query, key) pair of one row, the rest at ``lengths[0]``) from counts
    at lengths ``L, L - u, L - 2u, L - 3u``: ``A`` from the second difference, checked by the
    third."""
    step = lengths[0] - lengths[1]
    c0, c1, c2, c3 = counts
    if c0 - 3 * c1 + 3 * c2 - c3:
        raise InputError(f"{record.model}: its tensor-parallel rank's {what} at {lengths} "
                         f"positions ({counts}) are no quadratic in the sequence: a term of a "
                         f"higher degree does not split over a ring; analyze --cp without "
                         f"--tp.")
    quadratic = Fraction(c0 - 2 * c1 + c2, 2 * step * step)  # A = rows x cost per pair
    per_pair = quadratic / record.batch
    if per_pair.denominator != 1:
        raise InputError(f"{record.model}: its tensor-parallel rank's {what} give "
                         f"{per_pair} per (query, key) pair of a row, no whole count: the "
                         f"terms quadratic in the sequence are not attention's pairs.")
    return int(per_pair), int(c0 - quadratic * lengths[0] ** 2)


__all__ = ["fit_lengths", "with_tensor_parallel"]
