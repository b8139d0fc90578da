"""The memory of a step at symbolic sizes (``exportflops.memory(..., dynamic_shapes=...)``):
each kind's live bytes as polynomials in the sizes, the peak the largest of the candidate
points. Imports no torch. How the polynomials are found: docs/memory.md#symbolic-sizes."""

from __future__ import annotations

from typing import Literal

import sympy

from .base import SCHEMA_VERSION, Record
from .memory import KindBytes, Phase
from .symbolic import largest_size, parse_count, size_symbol
from ..device_table import device_row
from ..errors import InputError, UnknownDeviceError


#: The most `SymbolicMemoryReport.largest` searches an unbounded size to (polynomials are
#: cheap to evaluate: no step runs).
SEARCHED = 2**40


class MemorySize(Record):
    """A dynamic size of the step (a ``torch.export.Dim``)."""

    name: str
    """The Dim's name: the symbol the polynomials are in."""
    example: int
    """Its value in the example inputs."""
    min: int
    """The smallest size the polynomials hold for: the smallest size sampled."""
    max: int | None
    """The Dim's max; None: unbounded."""


class KindExpressions(Record):
    """Live bytes by kind, each a polynomial in the sizes as its string (the kinds are
    `KindBytes`' and mean what they mean there)."""

    parameters: str
    """The parameters' bytes."""
    buffers: str
    """The buffers' bytes."""
    gradients: str
    """The gradients' bytes."""
    optimizer: str
    """The optimizer states' bytes."""
    activations: str
    """The bytes saved for the backward."""
    temporaries: str
    """Every other tensor's bytes."""
    inputs: str
    """The inputs' bytes."""


class SymbolicPoint(Record):
    """One op of the step that may hold the peak (or a kind's maximum) at some sizes."""

    index: int
    """The op's position in the step, from 0 (the same at every size)."""
    op: str
    """The ATen op (``aten.mm.default``)."""
    module: str
    """Path of the module the op ran in (`MemoryPoint.module`)."""
    phase: Phase
    """forward (the loss included), backward or optimizer."""
    live: KindExpressions
    """The live bytes right after the op, by kind."""


class MemoryAtSizes(Record):
    """`SymbolicMemoryReport.evaluate`: the step's memory at given sizes, the numbers a
    `MemoryReport` of a step at those sizes gives."""

    sizes: dict[str, int]
    """The sizes evaluated at."""
    peak_bytes: int
    """The peak at these sizes (as `MemoryReport.peak_bytes`)."""
    by_kind: KindBytes
    """What holds the peak."""
    max_by_kind: KindBytes
    """Each kind's maximum at these sizes."""
    peak_phase: Phase
    """The peak's phase."""
    peak_node: str
    """Its candidate's op and position (``aten.mm.default #412``)."""
    peak_module: str
    """That op's module."""


class SymbolicMemoryReport(Record):
    """The memory of one step of a model as polynomials in its dynamic sizes.

    Every op that may hold the peak, or a kind's maximum, at some sizes is a candidate; at
    given sizes the peak is the largest candidate. ``evaluate(**sizes)`` gives the numbers,
    ``largest(size, budget)`` the largest size that fits.
    """

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The analyzed model's class."""
    mode: Literal["train", "forward"]
    """What the step runs (`MemoryReport.mode`)."""
    optimizer: str = ""
    """The optimizer of a training step; ``""`` in forward."""
    allocator: Literal["exact"] = "exact"
    """Exact storage bytes (the CUDA allocator's rounding is no polynomial)."""
    sizes: list[MemorySize]
    """The dynamic sizes, in the order ``dynamic_shapes`` names them."""
    sampled: list[dict[str, int]]
    """The sizes the step ran at to find the polynomials."""
    verified_at: dict[str, int]
    """The sizes of the extra step the polynomials were checked against, op by op."""
    steps: int
    """The ops of the step (the same at every size)."""
    candidates: list[SymbolicPoint]
    """The ops that may hold the peak or a kind's maximum, in step order."""

    def evaluate(self, **sizes: int) -> MemoryAtSizes:
        """The step's memory at ``sizes`` (every size by name, within its range)."""
        return self._at(self._check(sizes), self._parsed())

    def largest(self, size: str, budget: int | str, **fixed: int) -> int:
        """The largest value of ``size`` whose peak is at most ``budget`` (bytes, or a device
        key: its capacity, as `MemoryReport.fits` compares; `exportflops.fit` leaves a
        headroom, this does not), the other sizes at ``fixed``; 0 when its smallest value
        does not fit; at most the size's max, or `SEARCHED` where it has none. An
        `InputError` unless every candidate's bytes are non-decreasing in ``size`` (the
        search's premise), checked on the polynomials."""
        limit = budget if isinstance(budget, int) else self._capacity(budget)
        ranges = {s.name: s for s in self.sizes}
        if size not in ranges:
            raise InputError(f"largest({size!r}): the sizes of this report are "
                             f"{sorted(ranges)}.")
        given = self._check({**fixed, size: ranges[size].min})
        parsed = self._parsed()
        self._non_decreasing(size, given, parsed)
        high = ranges[size].max or SEARCHED

        def fits(value: int) -> bool:
            return self._at({**given, size: value}, parsed).peak_bytes <= limit
        return largest_size(fits, ranges[size].min, high)

    def largest_each(self, budget: int | str) -> dict[str, int]:
        """{size: `largest` of it}, each with the other sizes at the example's
        (`example_sizes`)."""
        example = self.example_sizes()
        return {size: self.largest(size, budget, **{other: value for other, value
                                                    in example.items() if other != size})
                for size in example}

    def example_sizes(self) -> dict[str, int]:
        """The example's sizes, each at least its size's smallest sampled value (an example
        below the samples is taken at their first)."""
        return {s.name: max(s.example, s.min) for s in self.sizes}

    def _capacity(self, device: str) -> int:
        row = device_row(device)  # an unknown key: UnknownDeviceError naming the keys
        if row.memory_bytes is None:
            raise UnknownDeviceError(f"The device table's {device} row covers boards with "
                                     f"different memory; pass your board's bytes.")
        return row.memory_bytes

    def _parsed(self) -> list[tuple[SymbolicPoint, dict[str, sympy.Expr]]]:
        return [(point, {kind: parse_count(getattr(point.live, kind))
                         for kind in KindBytes.model_fields}) for point in self.candidates]

    def _check(self, sizes: dict[str, int]) -> dict[str, int]:
        names = [s.name for s in self.sizes]
        if set(sizes) != set(names):
            raise InputError(f"{self.model}'s memory is in sizes {names}: give each of them "
                             f"by name (given {sorted(sizes)}).")
        for s in self.sizes:
            value = sizes[s.name]
            if isinstance(value, bool) or not isinstance(value, int) or value < s.min or (
                    s.max is not None and value > s.max):
                raise InputError(f"{s.name}={value!r}: {self.model}'s memory holds for "
                                 f"integers in [{s.min}, {s.max if s.max else 'inf'}] (the "
                                 f"sizes sampled start at {s.min}).")
        return sizes

    def _at(self, sizes: dict[str, int],
            parsed: list[tuple[SymbolicPoint, dict[str, sympy.Expr]]]) -> MemoryAtSizes:
        values = {size_symbol(name): value for name, value in sizes.items()}
        points = [(point, {kind: int(expr.xreplace(values)) if isinstance(expr, sympy.Basic)
                           else expr for kind, expr in kinds.items()})
                  for point, kinds in parsed]
        peak, live = max(points, key=lambda p: (sum(p[1].values()), -p[0].index))
        return MemoryAtSizes(
            sizes=sizes, peak_bytes=sum(live.values()), peak_phase=peak.phase,
            peak_node=f"{peak.op} #{peak.index}", peak_module=peak.module,
            by_kind=KindBytes(**live),
            max_by_kind=KindBytes(**{kind: max(kinds[kind] for _, kinds in points)
                                     for kind in KindBytes.model_fields}))

    def _non_decreasing(self, size: str, given: dict[str, int],
                        parsed: list[tuple[SymbolicPoint, dict[str, sympy.Expr]]]) -> None:
        """Each candidate's total grows by ``f(x + 1) - f(x)``, of degree <= 1 in ``x`` once
        the other sizes are fixed: >= 0 for every x >= min when it is at min and its slope
        is >= 0."""
        x = size_symbol(size)
        others = {size_symbol(name): value for name, value in given.items() if name != size}
        low = given[size]
        for point, kinds in parsed:
            total = sympy.expand(sympy.Add(*kinds.values()).xreplace(others))
            step = sympy.expand(total.subs(x, x + 1) - total)
            slope = step.coeff(x, 1) if step.has(x) else 0
            if step.subs(x, low) < 0 or slope < 0 or sympy.degree(step, x) > 1:
                raise InputError(
                    f"The live bytes of {self.model}'s step at op #{point.index} "
                    f"({point.op}) fall as {size} grows ({total}), so the largest {size} that "
                    f"fits is no search's answer: evaluate() the sizes you consider.")
