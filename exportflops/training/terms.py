"""A step's count as terms by how they scale: per row, per token, per document, per batch.

An analysis symbolic in ``batch`` and ``seq`` gives each count as an expression, e.g.
``1628*batch*seq**2 + 499553*batch*seq + batch + 75*seq`` for a two-layer Llama's step. Its
terms say where the work runs:

- linear in ``batch`` and of degree 0 or 1 in ``seq``: per row and per token, so a row counts
  at its own length (padding excluded) and a packed row at its total length;
- linear in ``batch`` and of degree 2 or more in ``seq``: attention over the sequence, so a
  packed row counts it per document, ``sum(L_i ** d)`` (varlen attention attends within each
  document);
- anything else (no ``batch``: work done once per step, like a rotary table; or not a
  polynomial, like a sort's ``ceiling(log2(n))``): as the graph runs it, at the batch's sizes.

Each group is compiled once to a Python function of the sizes, so evaluating a step is a few
arithmetic operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..records.symbolic import parse_count, size_symbol

#: How a group of terms is evaluated: ``row`` per row at its length, ``document`` per
#: document of a row, ``step`` once at the batch's executed sizes.
PER_ROW, PER_DOCUMENT, PER_STEP = "row", "document", "step"


@dataclass(frozen=True)
class TermGroup:
    """The terms of one count that scale the same way, compiled."""

    scaling: str
    """``row``, ``document`` or ``step`` (`PER_ROW`, `PER_DOCUMENT`, `PER_STEP`)."""
    seq_degree: int
    """The terms' degree in the sequence size (0 for ``step``)."""
    evaluate: Callable[..., int]
    """The group's value at sizes given by keyword (every size name of the count)."""

    @property
    def per_document(self) -> bool:
        """Work a packed document does by itself: its tokens' and its attention's."""
        return self.scaling != PER_STEP and self.seq_degree >= 1


@dataclass(frozen=True)
class StepCount:
    """One count of a step (the forward's FLOPs, the backward's, the recompute's)."""

    names: tuple[str, ...]
    """The size names the count depends on."""
    executed: Callable[..., int]
    groups: tuple[TermGroup, ...]
    powers: tuple[tuple[str, str, int], ...] = ()
    """For each row and document group: the name standing for its power sum in `summed`, its
    scaling and its degree in the sequence size."""
    summed: Callable[..., int] | None = None
    """The count with each row or document group's ``batch * seq**d`` replaced by its power
    sum: the useful count, evaluated once (`useful`)."""

    def at(self, sizes: dict[str, int]) -> int:
        """The count as the graph runs it at these sizes."""
        return self.executed(**self._sized(sizes))

    def useful(self, sizes: dict[str, int], rows: list[list[int]], batch: str,
               seq: str | None) -> int:
        """The count at each row's own documents' lengths: ``rows`` holds each row's
        documents (one per unpacked row: its length without padding).

        A row or document group is linear in ``batch`` and a sum of terms ``c * seq**d`` of
        one degree ``d``, so its sum over the rows (or documents) of lengths ``L_i`` is
        ``c * sum(L_i ** d)``: `summed` holds each group with its ``batch * seq**d`` replaced
        by that power sum, one evaluation in exact integers however many rows there are."""
        if seq is None or self.summed is None:
            return self.at(sizes)
        units = {PER_ROW: [sum(row) for row in rows],
                 PER_DOCUMENT: [length for row in rows for length in row]}
        values = self._sized(sizes)
        for name, scaling, degree in self.powers:
            values[name] = sum(length ** degree for length in units[scaling])
        return self.summed(**values)

    def document(self, sizes: dict[str, int], length: int, batch: str, seq: str) -> int:
        """A document's own work: its per-token and attention terms at its length."""
        values = self._sized(sizes, {batch: 1, seq: length})
        return sum(group.evaluate(**values) for group in self.groups if group.per_document)

    def _sized(self, sizes: dict[str, int], override: dict | None = None) -> dict[str, int]:
        values = {name: sizes[name] for name in self.names}
        if override:
            values.update({k: v for k, v in override.items() if k in values})
        return values


def step_count(expression: int | str | sympy.Expr, batch: str, seq: str | None) -> StepCount:
    """``expression`` (a count of the analysis) split into its scaling groups."""
    expr = sympy.expand(sympy.sympify(parse_count(expression)))
    names = tuple(sorted(s.name for s in expr.free_symbols))
    symbols = [size_symbol(name) for name in names]
    by_scaling: dict[tuple, sympy.Expr] = {}
    for term in sympy.Add.make_args(expr):
        key = _scaling(term, size_symbol(batch), size_symbol(seq) if seq else None)
        by_scaling[key] = by_scaling.get(key, 0) + term
    groups = tuple(TermGroup(scaling, degree, _compiled(part, symbols, names))
                   for (scaling, degree), part in by_scaling.items())
    executed = _compiled(expr, symbols, names)
    if seq is None:
        return StepCount(names, executed, groups)
    powers, stand_ins, summed = [], [], sympy.Integer(0)
    for (scaling, degree), part in by_scaling.items():
        if scaling != PER_STEP:
            # Not an identifier, so no dynamic size has this name; a Dummy, so no symbol is it.
            powers.append((f"{scaling} power {degree}", scaling, degree))
            stand_ins.append(sympy.Dummy(powers[-1][0], integer=True))
            part = part.subs({size_symbol(batch): stand_ins[-1], size_symbol(seq): 1})
        summed += part
    every = names + tuple(name for name, _, _ in powers)
    return StepCount(names, executed, groups, tuple(powers),
                     _compiled(summed, symbols + stand_ins, every))


def _scaling(term: sympy.Expr, batch: sympy.Symbol, seq: sympy.Symbol | None) -> tuple[str, int]:
    """How ``term`` scales, and its degree in ``seq``."""
    if seq is None or not term.is_polynomial(batch, seq):
        return PER_STEP, 0
    if sympy.degree(term, batch) != 1:
        return PER_STEP, 0
    degree = int(sympy.degree(term, seq))
    return (PER_ROW if degree <= 1 else PER_DOCUMENT), degree


def _compiled(expr: sympy.Expr, symbols: list, names: tuple[str, ...]) -> Callable[..., int]:
    """``expr`` as a Python function of the sizes by keyword, in exact integer arithmetic where
    the expression is a polynomial (a ceiling or a log goes through math, then rounds)."""
    function = sympy.lambdify(symbols, expr, modules="math")
    position = {name: i for i, name in enumerate(names)}

    def evaluate(**sizes: int) -> int:
        values = [0] * len(names)
        for name, value in sizes.items():
            values[position[name]] = value
        return int(round(function(*values)))

    return evaluate
