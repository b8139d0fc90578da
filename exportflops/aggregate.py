"""Pure: node records + module tree -> `Report` (inclusive/exclusive, per op, module x op,
uncounted)."""

from __future__ import annotations

from collections import defaultdict

import sympy

from .attribution import ModuleInfo, ancestors
from .records import (Counts, ModuleRecord, NodeRecord, OperatorStats, Report,
                      SizeSymbolRecord, TensorSpec, TiedParameter, UncountedOp)


#: Field order of `Counts`; a node's cost is read once into a tuple in this order.
_FIELDS = tuple(Counts.model_fields)


#: The counts of no node; records are frozen, so every empty sum shares it.
_NOTHING = Counts()


def _values(counts: Counts) -> tuple:
    return tuple(getattr(counts, name) for name in _FIELDS)


class _Sum:
    """Running sum of counts: ints added as they come, symbolic terms added once at the end
    (one sympy.Add of many terms is far cheaper than many two-term sums)."""

    __slots__ = ("calls", "ints", "terms")

    def __init__(self) -> None:
        self.calls = 0
        self.ints = [0] * len(_FIELDS)
        self.terms: list[list] = [[] for _ in _FIELDS]

    def add(self, values: tuple) -> None:
        self.calls += 1
        ints = self.ints
        for i, value in enumerate(values):
            if type(value) is int:
                ints[i] += value
            else:
                self.terms[i].append(value)

    def counts(self) -> Counts:
        if self.calls == 0:
            return _NOTHING
        # Values are already ints or sympy expressions: no validation needed.
        return Counts.model_construct(**{
            name: self.ints[i] + sympy.expand(sympy.Add(*self.terms[i])) if self.terms[i]
            else self.ints[i]
            for i, name in enumerate(_FIELDS)})


class _Phases:
    """A `_Sum` over all nodes and one over the backward nodes alone."""

    __slots__ = ("all", "backward")

    def __init__(self) -> None:
        self.all, self.backward = _Sum(), _Sum()

    def add(self, values: tuple, backward: bool) -> None:
        self.all.add(values)
        if backward:
            self.backward.add(values)

    def stats(self) -> OperatorStats:
        return OperatorStats.model_construct(calls=self.all.calls, cost=self.all.counts(),
                             backward_calls=self.backward.calls, backward=self.backward.counts())


def build_report(nodes: list[NodeRecord], tree: dict[str, ModuleInfo], tied: dict[str, str], *,
                 model: str, inputs: list[TensorSpec], torch_version: str,
                 exportflops_version: str, mode: str = "forward",
                 symbols: list[SizeSymbolRecord] = ()) -> Report:
    inclusive: dict[str, _Phases] = defaultdict(_Phases)
    exclusive: dict[str, _Sum] = defaultdict(_Sum)
    module_ops: dict[str, dict[str, _Phases]] = defaultdict(lambda: defaultdict(_Phases))
    operators: dict[str, _Phases] = defaultdict(_Phases)
    lineage: dict[str, list[str]] = {}
    for node in nodes:
        values, backward = _values(node.cost), node.phase == "backward"
        exclusive[node.module].add(values)
        operators[node.op].add(values, backward)
        if node.module not in lineage:
            lineage[node.module] = ancestors(node.module)
        for path in lineage[node.module]:
            inclusive[path].add(values, backward)
            module_ops[path][node.op].add(values, backward)

    modules = [
        ModuleRecord.model_construct(
            path=info.path, type=info.type_name, depth=info.depth, calls=info.calls,
            params=info.params, own_params=info.own_params, tied_params=info.tied_params,
            inclusive=inclusive[info.path].all.counts(), exclusive=exclusive[info.path].counts(),
            backward=inclusive[info.path].backward.counts(),
            operators={op: s.stats() for op, s in module_ops[info.path].items()},
        )
        for info in tree.values()
    ]
    return Report(
        model=model,
        inputs=inputs,
        torch_version=torch_version,
        exportflops_version=exportflops_version,
        mode=mode,
        total=inclusive[""].all.counts(),
        backward=inclusive[""].backward.counts(),
        symbols=list(symbols),
        params=tree[""].params,
        tied_parameters=[TiedParameter(name=n, counted_as=c) for n, c in tied.items()],
        modules=modules,
        operators={op: s.stats() for op, s in operators.items()},
        uncounted=_uncounted(nodes),
        nodes=nodes,
    )


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
