"""Pure: what counting returns (`Counted`: node records, module tree, collectives) -> `Report`
(inclusive/exclusive, per op, module x op, uncounted), by `build_report`, the one way to a
report. A part of a count (a pipeline stage of a rank) is a `Counted` of its nodes, selected."""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import sympy
import torch

from .attribution import ModuleInfo
from .records.names import Moved, ancestors, parent
from .records.symbolic import factor_bases, polynomial
from .records import (Collective, Cost, ModuleRecord, NodeRecord, OperatorStats, Report,
                      SizeSymbolRecord, TensorSpec, TiedParameter, UncountedOp)
from .version import __version__


T = TypeVar("T")

#: Field order of `Cost`; a node's cost is read once into a tuple in this order.
_FIELDS = tuple(Cost.model_fields)


def _values(counts: Cost) -> tuple:
    return tuple(getattr(counts, name) for name in _FIELDS)


class _Sum:
    """Running sum of counts: ints added as they come, symbolic terms counted per field and
    distinct expression and added once at the end (one sympy.Add of many terms is far cheaper
    than many two-term sums, and a model's repeated layers give the same few expressions)."""

    __slots__ = ("calls", "ints", "terms")

    def __init__(self) -> None:
        self.calls = 0
        self.ints = [0] * len(_FIELDS)
        self.terms: dict[tuple[int, sympy.Expr], int] | None = None
        """(field's place, expression) -> times, once a symbolic value arrives."""

    def add(self, values: tuple) -> None:
        self.calls += 1
        ints = self.ints
        for i, value in enumerate(values):
            if type(value) is int:
                ints[i] += value
            else:
                if self.terms is None:
                    self.terms = {}
                self.terms[i, value] = self.terms.get((i, value), 0) + 1

    def merge(self, other: _Sum) -> None:
        # A symbolic GPT-2 report's roll-up merges some 2,000 sums: its ints in one map.
        self.calls += other.calls
        self.ints = list(map(operator.add, self.ints, other.ints))
        if other.terms is not None:
            if self.terms is None:
                self.terms = dict(other.terms)
            else:
                mine = self.terms
                for term, times in other.terms.items():
                    mine[term] = mine.get(term, 0) + times

    @classmethod
    def of(cls, sums) -> _Sum:
        total = cls()
        for one in sums:
            total.merge(one)
        return total

    def counts(self) -> Cost:
        if self.terms is None:
            return _int_counts(tuple(self.ints))
        return _symbolic_counts(tuple(self.ints), tuple(self.terms.items()))

    def key(self) -> tuple:
        """What identifies these counts."""
        terms = None if self.terms is None else tuple(self.terms.items())
        return self.calls, *self.ints, terms


@functools.lru_cache(maxsize=1 << 12)
def _symbolic_counts(ints: tuple[int, ...], terms: tuple[tuple[tuple[int, sympy.Expr], int]]
                     ) -> Cost:
    # Each repeated block's modules and operators sum equal terms: their counts are made once
    # (a symbolic GPT-2 report sums some 1,100). Values are already ints or sympy
    # expressions: no validation needed.
    summed: dict[int, dict] = defaultdict(dict)
    for (place, term), times in terms:
        coefficients = summed[place]
        for monomial, coefficient in _monomials(term):
            coefficients[monomial] = coefficients.get(monomial, 0) + coefficient * times
    values = list(ints)
    for place, coefficients in summed.items():
        # Like monomials collected in ints, then one sum of the few distinct ones: the sum's
        # expansion, as sympy.expand writes it.
        values[place] = polynomial(ints[place], coefficients)
    return Cost.model_construct(**dict(zip(_FIELDS, values)))


@functools.lru_cache(maxsize=1 << 12)
def _monomials(term: sympy.Expr) -> tuple[tuple[sympy.Expr, int | sympy.Rational], ...]:
    """The expansion of ``term`` as (monomial, coefficient) pairs (``as_coefficients_dict``;
    a constant's monomial is 1), each coefficient an int where it is one. ``sympy.expand`` is
    skipped where the term is plainly expanded already (products and powers of numbers and
    symbols, and sums of them: nearly every count), as it costs as much for an expanded term
    as for any."""
    expanded = term if _plainly_expanded(term) else sympy.expand(term)
    return tuple((monomial, int(coefficient) if coefficient.is_Integer else coefficient)
                 for monomial, coefficient in expanded.as_coefficients_dict().items())


def _plainly_expanded(term: sympy.Expr) -> bool:
    return all(base.is_Number or base.is_Symbol for base in factor_bases(term))


@functools.lru_cache(maxsize=1 << 16)
def _int_counts(ints: tuple[int, ...]) -> Cost:
    # A model repeats the same layer: records are frozen, so equal counts share one object.
    return Cost.model_construct(**dict(zip(_FIELDS, ints)))


class _Phases:
    """A `_Sum` over all nodes and one over the backward nodes alone."""

    __slots__ = ("all", "backward")

    def __init__(self) -> None:
        self.all, self.backward = _Sum(), _Sum()

    def merge(self, other: _Sum, backward: bool) -> None:
        self.all.merge(other)
        if backward:
            self.backward.merge(other)

    @classmethod
    def of(cls, phases) -> _Phases:
        total = cls()
        for one in phases:
            total.all.merge(one.all)
            total.backward.merge(one.backward)
        return total

    def stats(self, shared: dict[tuple, OperatorStats]) -> OperatorStats:
        """The stats; equal ones are taken from ``shared`` (frozen records)."""
        key = self.all.key(), self.backward.key()
        if key not in shared:
            shared[key] = self._stats()
        return shared[key]

    def _stats(self) -> OperatorStats:
        return OperatorStats.model_construct(calls=self.all.calls, cost=self.all.counts(),
                                             backward_calls=self.backward.calls,
                                             backward=self.backward.counts())


@dataclass(frozen=True)
class Counted:
    """One call counted, before it is a `Report`: what `exportflops.api` returns to
    `build_report`, and what a part of the call (a pipeline stage of a rank) is selected from
    (`exportflops.parallel.pipeline.slices`)."""

    nodes: list[NodeRecord]
    """Every counted node, in graph order (the backward's after the forward's)."""
    tree: dict[str, ModuleInfo]
    """The modules by path, parents before children (`exportflops.attribution.module_tree`)."""
    tied: dict[str, str]
    """Each tied parameter's name -> the name it is counted under."""
    model: str
    inputs: list[TensorSpec]
    mode: Literal["forward", "train"] = "forward"
    symbols: list[SizeSymbolRecord] = field(default_factory=list)
    split: bool = False
    """The backward counted in its two passes: the weight pass's sum is reported, zero when
    no node has one."""
    world_size: int = 1
    rank: int = 0
    collectives: list[Collective] = field(default_factory=list)
    capture: Literal["export", "eager"] = "export"
    capture_notes: list[str] = field(default_factory=list)
    value_guards: list[str] = field(default_factory=list)
    sizes: dict[str, int] | None = None
    """The sizes the report is evaluated at (`Report.evaluate`), where the call gave them."""


def with_paths(counted: Counted, paths: dict[str, str]) -> Counted:
    """``counted`` with each module path ``p`` of ``paths`` written ``paths[p]`` wherever it
    names a module (`Moved`): the count of a call alike another's (a pipeline stage of the
    same layers as an earlier one) under its own names, as `Report.with_paths` moves a
    report."""
    moved = Moved(paths)
    return replace(
        counted, nodes=[moved.node_record(n) for n in counted.nodes],
        tree={moved.path(path): replace(info, path=moved.path(path))
              for path, info in counted.tree.items()},
        tied={moved.parameter(name): moved.parameter(first)
              for name, first in counted.tied.items()},
        collectives=[moved.collective(c) for c in counted.collectives])


def build_report(counted: Counted) -> Report:
    """``counted``'s `Report`: its nodes summed per module, per op and per module and op."""
    report = _aggregated(counted)
    return report if counted.sizes is None else report.evaluate(**counted.sizes)


def _aggregated(counted: Counted) -> Report:
    nodes, tree = counted.nodes, counted.tree
    own: dict[str, dict[tuple[str, bool], _Sum]] = defaultdict(lambda: defaultdict(_Sum))
    for node in nodes:
        own[node.module][(node.op, node.phase == "backward")].add(_values(node.cost))
    module_ops = {path: _by_op(sums)
                  for path, sums in rolled_up(own, _merged, lambda: defaultdict(_Sum)).items()}
    own_ops = {path: _by_op(sums) for path, sums in own.items()}
    inclusive = {path: _Phases.of(ops.values()) for path, ops in module_ops.items()}
    exclusive = {path: _Sum.of(sums.values()) for path, sums in own.items()}
    operators = module_ops.get("", {})
    idle = _Phases()

    shared: dict[tuple, OperatorStats] = {}
    modules = [
        ModuleRecord.model_construct(
            path=info.path, type=info.type_name, depth=info.depth, calls=info.calls,
            params=info.params, own_params=info.own_params, tied_params=info.tied_params,
            inclusive=inclusive.get(info.path, idle).all.counts(),
            exclusive=exclusive.get(info.path, idle.all).counts(),
            backward=inclusive.get(info.path, idle).backward.counts(),
            operators={op: s.stats(shared) for op, s in module_ops.get(info.path, {}).items()},
            exclusive_operators={op: s.stats(shared)
                                 for op, s in own_ops.get(info.path, {}).items()},
        )
        for info in tree.values()
    ]
    weight = _weight_half(nodes)
    return Report(
        model=counted.model,
        inputs=counted.inputs,
        torch_version=torch.__version__,
        exportflops_version=__version__,
        mode=counted.mode,
        total=inclusive.get("", idle).all.counts(),
        backward=inclusive.get("", idle).backward.counts(),
        # split, with no backward op at all: an empty weight pass
        backward_weight=Cost() if weight is None and counted.split else weight,
        symbols=list(counted.symbols),
        params=tree[""].params,
        tied_parameters=[TiedParameter(name=n, counted_as=c) for n, c in counted.tied.items()],
        modules=modules,
        operators={op: s.stats(shared) for op, s in operators.items()},
        uncounted=_uncounted(nodes),
        nodes=nodes,
        world_size=counted.world_size,
        rank=counted.rank,
        collectives=counted.collectives,
        capture=counted.capture,
        capture_notes=counted.capture_notes,
        value_guards=counted.value_guards,
    )


def _weight_half(nodes: list[NodeRecord]) -> Cost | None:
    """The weight half's counts when the backward was split, else None."""
    if not any(node.gradient for node in nodes):
        return None
    weight = _Sum()
    for node in nodes:
        if node.gradient == "weight":
            weight.add(_values(node.cost))
    return weight.counts()


def rolled_up(own: Mapping[str, T], add: Callable[[T, T], T],
              zero: Callable[[], T]) -> dict[str, T]:
    """Per module path, the inclusive value from the exclusive ones: ``own``'s value of the path
    plus the rolled-up values of the modules under it. Paths are those of ``own`` and every
    module above them; each is pushed once into its parent, deepest first. ``add(total, value)``
    returns the sum (it may update ``total`` in place and return it). The one roll-up of the
    module tree: counts here, latencies (`exportflops.runtime.measured`) and predicted times
    (`exportflops.roofline.predict`) alike."""
    # Sorted: a set's order changes with PYTHONHASHSEED, and so would the order in which
    # each parent merges its children (the keys of a merged per-operator dict).
    paths = sorted({p for path in own for p in ancestors(path)})
    rolled = {path: zero() for path in paths}
    for path in sorted(paths, key=lambda p: -len(ancestors(p))):
        if path in own:
            rolled[path] = add(rolled[path], own[path])
        if path:
            rolled[parent(path)] = add(rolled[parent(path)], rolled[path])
    return rolled


def _merged(total: dict[tuple, _Sum], sums: dict[tuple, _Sum]) -> dict[tuple, _Sum]:
    for key, one in sums.items():
        total[key].merge(one)
    return total


def _by_op(sums: dict[tuple[str, bool], _Sum]) -> dict[str, _Phases]:
    by_op: dict[str, _Phases] = defaultdict(_Phases)
    for (op, backward), one in sums.items():
        by_op[op].merge(one, backward)
    return dict(by_op)


def _uncounted(nodes: list[NodeRecord]) -> list[UncountedOp]:
    by_op: dict[tuple[str, str], list[NodeRecord]] = defaultdict(list)
    for node in nodes:
        if node.status in ("uncounted", "error"):
            by_op[(node.op, node.note)].append(node)
    return [
        UncountedOp(op=op, calls=len(group), modules=sorted({n.module for n in group}),
                    nodes=[n.name for n in group], reason=reason)
        for (op, reason), group in by_op.items()
    ]
