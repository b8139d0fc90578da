"""Pure: node records + module tree -> `Report` (inclusive/exclusive, per op, module x op,
uncounted)."""

from __future__ import annotations

from collections import defaultdict

from .attribution import ModuleInfo, ancestors
from .records import (Counts, ModuleRecord, NodeRecord, OperatorStats, Report, TensorSpec,
                      TiedParameter, UncountedOp)


class _Sum:
    """Running calls and summed counts of one op or module (plain ints: pydantic only at the end)."""

    __slots__ = ("calls", "values")

    def __init__(self) -> None:
        self.calls = 0
        self.values = [0] * len(Counts.model_fields)

    def add(self, counts: Counts) -> None:
        self.calls += 1
        for i, name in enumerate(Counts.model_fields):
            self.values[i] += getattr(counts, name)

    def counts(self) -> Counts:
        return Counts(**dict(zip(Counts.model_fields, self.values)))

    def stats(self) -> OperatorStats:
        return OperatorStats(calls=self.calls, cost=self.counts())


def build_report(nodes: list[NodeRecord], tree: dict[str, ModuleInfo], tied: dict[str, str], *,
                 model: str, inputs: list[TensorSpec], torch_version: str,
                 exportflops_version: str) -> Report:
    inclusive: dict[str, _Sum] = defaultdict(_Sum)
    exclusive: dict[str, _Sum] = defaultdict(_Sum)
    module_ops: dict[str, dict[str, _Sum]] = defaultdict(lambda: defaultdict(_Sum))
    operators: dict[str, _Sum] = defaultdict(_Sum)
    for node in nodes:
        exclusive[node.module].add(node.cost)
        operators[node.op].add(node.cost)
        for path in ancestors(node.module):
            inclusive[path].add(node.cost)
            module_ops[path][node.op].add(node.cost)

    modules = [
        ModuleRecord(
            path=info.path, type=info.type_name, depth=info.depth, calls=info.calls,
            params=info.params, own_params=info.own_params, tied_params=info.tied_params,
            inclusive=inclusive[info.path].counts(), exclusive=exclusive[info.path].counts(),
            operators={op: s.stats() for op, s in module_ops[info.path].items()},
        )
        for info in tree.values()
    ]
    return Report(
        model=model,
        inputs=inputs,
        torch_version=torch_version,
        exportflops_version=exportflops_version,
        total=inclusive[""].counts(),
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
