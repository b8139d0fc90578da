"""Pure: node records + module tree -> `Report` (inclusive/exclusive, per op, module x op,
uncounted)."""

from __future__ import annotations

from collections import defaultdict

import sympy

from .attribution import ModuleInfo, ancestors
from .records import (Counts, ModuleRecord, NodeRecord, OperatorStats, Report,
                      SizeSymbolRecord, TensorSpec, TiedParameter, UncountedOp)


class _Sum:
    """Running sum of counts: ints added as they come, symbolic terms added once at the end
    (one sympy.Add of many terms is far cheaper than many two-term sums)."""

    __slots__ = ("calls", "ints", "terms")

    def __init__(self) -> None:
        self.calls = 0
        self.ints = [0] * len(Counts.model_fields)
        self.terms: list[list] = [[] for _ in Counts.model_fields]

    def add(self, counts: Counts) -> None:
        self.calls += 1
        for i, name in enumerate(Counts.model_fields):
            value = getattr(counts, name)
            if isinstance(value, int):
                self.ints[i] += value
            else:
                self.terms[i].append(value)

    def counts(self) -> Counts:
        return Counts(**{name: self.ints[i] + sympy.expand(sympy.Add(*self.terms[i]))
                         if self.terms[i] else self.ints[i]
                         for i, name in enumerate(Counts.model_fields)})


class _Phases:
    """A `_Sum` over all nodes and one over the backward nodes alone."""

    __slots__ = ("all", "backward")

    def __init__(self) -> None:
        self.all, self.backward = _Sum(), _Sum()

    def add(self, node: NodeRecord) -> None:
        self.all.add(node.cost)
        if node.phase == "backward":
            self.backward.add(node.cost)

    def stats(self) -> OperatorStats:
        return OperatorStats(calls=self.all.calls, cost=self.all.counts(),
                             backward_calls=self.backward.calls, backward=self.backward.counts())


def build_report(nodes: list[NodeRecord], tree: dict[str, ModuleInfo], tied: dict[str, str], *,
                 model: str, inputs: list[TensorSpec], torch_version: str,
                 exportflops_version: str, mode: str = "forward",
                 symbols: list[SizeSymbolRecord] = ()) -> Report:
    inclusive: dict[str, _Phases] = defaultdict(_Phases)
    exclusive: dict[str, _Sum] = defaultdict(_Sum)
    module_ops: dict[str, dict[str, _Phases]] = defaultdict(lambda: defaultdict(_Phases))
    operators: dict[str, _Phases] = defaultdict(_Phases)
    for node in nodes:
        exclusive[node.module].add(node.cost)
        operators[node.op].add(node)
        for path in ancestors(node.module):
            inclusive[path].add(node)
            module_ops[path][node.op].add(node)

    modules = [
        ModuleRecord(
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
