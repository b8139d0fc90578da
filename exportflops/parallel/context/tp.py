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

import math
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

import sympy

from ...errors import InputError
from ...records.collectives import Collective
from ...records.context import ContextParallelReport
from ...records.report import Report
from ...records.symbolic import parse_count, size_symbol
from ...training.per_batch import FlopsPerBatch
from .analysis import RingWork, ring_sends

#: The lengths of the rank's sequence counted: L - k u for these k.
_STEPS = range(4)


def fit_lengths(record: ContextParallelReport, tp: int) -> list[int]:
    """The lengths of one rank's sequence its tensor-parallel count is read at: ``L - k tp``,
    ``L = seq / cp``, for k = 0 .. 3 (module docstring)."""
    local = record.seq_len // record.cp
    if local % tp or local <= 3 * tp:
        chunks = 2 * record.cp if record.load_balanced else record.cp
        unit = math.lcm(chunks, record.cp * tp)
        shortest = unit * math.ceil((3 * tp + 1) * record.cp / unit)
        raise InputError(f"{record.model}: each rank of a ring of {record.cp} holds "
                         f"{local} positions, which tp {tp} must divide (a sequence-parallel "
                         f"plan splits them) and which must exceed 3 x tp (the count is read "
                         f"at {local} less 0 .. 3 x tp positions): give the example a sequence "
                         f"that is a multiple of {unit} and at least {shortest} long (--input, "
                         f"or --seq for hf: models).")
    return [local - k * tp for k in _STEPS]


class TensorParallelWork(NamedTuple):
    """A ring place's work as its tensor-parallel rank does it (`tensor_parallel_work`), and
    that rank's collectives: FSDP2's (mesh dimension ``fsdp``) and the plan's (``tp``)."""

    work: RingWork
    fsdp_collectives: list[Collective]
    tp_collectives: list[Collective]


def tensor_parallel_work(fpb: FlopsPerBatch, record: ContextParallelReport,
                         rank_at: Callable[[int], Report], *, tp: int) -> TensorParallelWork:
    """The work of each place of ``record``'s rings (`context_split` of ``fpb``, the
    single-device analysis) as its tensor-parallel rank does it, ``rank_at(length)`` being that
    rank's report on ``length`` positions of each row (sharded by FSDP2 too where the layout
    has fsdp), read at `fit_lengths`; the collectives are those of the count at ``L``.
    ``fpb``'s terms are checked to split as the fit needs (module docstring). `context_split`
    with it, ``tp`` and the collectives gives the record on the mesh (fsdp, cp, tp)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"{record.model}: tp must be an int >= 1, got {tp!r}.")
    _check_terms(fpb)
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
                         f"{record.attention_layers}: ring attention replaces each call, whose "
                         f"key and value the rank's count must show; analyze --cp without "
                         f"--tp.")
    work = RingWork(per_pair, other, ring_sends(calls, {}, record.mode, record.cp))
    return TensorParallelWork(work, *_collectives(local, record.model))


def _check_terms(fpb: FlopsPerBatch) -> None:
    """The single-device count splits as the fit needs: polynomial in the sequence, and every
    term of degree 2 or more in it is attention's, one per row of the batch (a mask built
    once per step, ``seq**2`` without the batch, would be read as pairs)."""
    batch, seq = size_symbol(fpb.batch), size_symbol(fpb.seq)
    for count in (fpb.report.total.flops, fpb.report.total.macs):
        for term in sympy.Add.make_args(sympy.expand(parse_count(count))):
            if not term.is_polynomial(seq) or (
                    sympy.degree(term, seq) >= 2
                    and (not term.is_polynomial(batch) or sympy.degree(term, batch) != 1)):
                raise InputError(f"{fpb.report.model}: its count has the term {term}, which "
                                 f"is not attention's pairs of each row nor work on each "
                                 f"token: a tensor-parallel rank's count, read at fixed "
                                 f"lengths, would not split over a ring; analyze --cp without "
                                 f"--tp.")


def _collectives(report: Report, model: str) -> tuple[list, list]:
    """(FSDP2's, the plan's) collectives of the rank's count: mesh dimension ``fsdp`` and
    ``tp``."""
    fsdp_collectives, tp_collectives = [], []
    for c in report.collectives:
        if c.mesh_dim == "fsdp":
            fsdp_collectives.append(c)
        elif c.mesh_dim == "tp":
            tp_collectives.append(c)
        else:
            raise InputError(f"{model}: its tensor-parallel rank issues {c.op} over mesh "
                             f"dimension {c.mesh_dim!r} ({c.module or 'the root'}), neither "
                             f"tp nor fsdp: analyze --cp without --tp.")
    return fsdp_collectives, tp_collectives


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
                         f"positions ({counts}) are not quadratic in the sequence: a term of a "
                         f"higher degree does not split over a ring; analyze --cp without "
                         f"--tp.")
    quadratic = Fraction(c0 - 2 * c1 + c2, 2 * step * step)  # A = rows x cost per pair
    per_pair = quadratic / record.batch
    if per_pair.denominator != 1 or (per_pair <= 0 and what == "forward flops"):
        raise InputError(f"{record.model}: its tensor-parallel rank's {what} give "
                         f"{per_pair} per (query, key) pair of a row, not a positive whole "
                         f"count: its terms quadratic in the sequence are not attention's "
                         f"pairs; analyze --cp without --tp.")
    return int(per_pair), int(c0 - quadratic * lengths[0] ** 2)


__all__ = ["TensorParallelWork", "fit_lengths", "tensor_parallel_work"]
