"""Evaluate a report whose counts are expressions of dynamic sizes, without re-exporting."""

from __future__ import annotations

import sympy

from .records import (Counts, ModuleRecord, NodeRecord, OperatorStats, Report, TensorSpec,
                      parse_count, size_symbol)


def evaluate_report(report: Report, sizes: dict[str, int]) -> Report:
    values = _size_values(report, sizes)
    evaluate = _Evaluator(values)
    return report.model_copy(update={
        "inputs": [evaluate.spec(t) for t in report.inputs],
        "total": evaluate.counts(report.total),
        "backward": evaluate.counts(report.backward),
        "symbols": [],
        "modules": [evaluate.module(m) for m in report.modules],
        "operators": evaluate.operators(report.operators),
        "nodes": [evaluate.node(n) for n in report.nodes],
    })


def _size_values(report: Report, sizes: dict[str, int]) -> dict[sympy.Symbol, int]:
    known = {s.name: s for s in report.symbols}
    unknown = sorted(set(sizes) - set(known))
    if unknown:
        raise KeyError(f"{report.model} has no dynamic size {', '.join(unknown)}; its dynamic "
                       f"sizes are: {', '.join(known) or 'none (the report is concrete)'}")
    values = {}
    for name, symbol in known.items():
        value = sizes.get(name, symbol.example)
        if value is None:
            raise ValueError(f"size {name!r} of {report.model} is data-dependent and has no "
                             f"example value: pass {name}=<int>")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"size {name!r} must be an int, got {type(value).__name__}")
        if (symbol.min is not None and value < _lowest(symbol.min)) or (
                symbol.max is not None and value > symbol.max):
            raise ValueError(f"size {name}={value} is outside the range the graph was exported "
                             f"for: [{symbol.min}, {symbol.max}]")
        values[size_symbol(name)] = value
    return values


def _lowest(exported_min: int) -> int:
    # export gives every dynamic size a minimum of 2 (it specializes sizes 0 and 1), not because
    # the graph's ops change at 1: counting at 1 evaluates the same ops.
    return 1 if exported_min == 2 else exported_min


class _Evaluator:
    """Evaluates each distinct expression once: a transformer repeats the same ones per layer."""

    def __init__(self, values: dict[sympy.Symbol, int]) -> None:
        self.values = values
        self.cache: dict = {}
        self.parsed: dict[str, sympy.Expr] = {}

    def value(self, expr):
        if isinstance(expr, int):
            return expr
        result = self.cache.get(expr)
        if result is None:
            result = self.cache[expr] = int(expr.xreplace(self.values))
        return result

    def counts(self, counts: Counts) -> Counts:
        return Counts.model_construct(**{name: self.value(getattr(counts, name))
                                         for name in Counts.model_fields})

    def spec(self, spec: TensorSpec) -> TensorSpec:
        if all(isinstance(d, int) for d in spec.shape):
            return spec
        shape = [d if isinstance(d, int) else self.value(self._parsed(d)) for d in spec.shape]
        return spec.model_copy(update={"shape": shape})

    def _parsed(self, text: str):
        expr = self.parsed.get(text)
        if expr is None:
            expr = self.parsed[text] = parse_count(text)
        return expr

    def operators(self, operators: dict[str, OperatorStats]) -> dict[str, OperatorStats]:
        return {op: s.model_copy(update={"cost": self.counts(s.cost),
                                         "backward": self.counts(s.backward)})
                for op, s in operators.items()}

    def module(self, module: ModuleRecord) -> ModuleRecord:
        return module.model_copy(update={
            "inclusive": self.counts(module.inclusive),
            "exclusive": self.counts(module.exclusive),
            "backward": self.counts(module.backward),
            "operators": self.operators(module.operators),
        })

    def node(self, node: NodeRecord) -> NodeRecord:
        return node.model_copy(update={
            "cost": self.counts(node.cost),
            "inputs": [self.spec(t) for t in node.inputs],
            "outputs": [self.spec(t) for t in node.outputs],
        })
