"""The flat views: ``summary`` (model-wide numbers), ``operators`` (fvcore's ``by_operator``),
``module_operators`` (fvcore's ``by_module_and_operator``), and the raw rows of `to_csv` and
`to_pandas` (one builder, `table_rows`).

Each prints the report's own totals; none is summed here.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from ..errors import optional_module
from ..records import Cost, GenerationReport, Report
from .collectives import collective_summary_rows
from .format import Style, magnitude
from .generation import generation_rows
from .tree import ModuleTree, root_label

#: The decisions on values the summary's note lists (an audio encoder's chunking makes a
#: hundred); the report keeps them all.
SHOWN_VALUE_GUARDS = 8


def require_report(value: Any, caller: str) -> None:
    """Refuse what is not a `Report` (the model itself, say) with the call that makes one;
    render imports no torch, so the message names the type only."""
    if not isinstance(value, Report):
        raise TypeError(
            f"{caller}() renders a Report, not a {type(value).__qualname__}: pass the report "
            f"of exportflops.analyze(model, args) (or exportflops.profile), e.g. "
            f"{caller}(exportflops.analyze(model, args)); a saved one loads with "
            f"Report.model_validate_json(text).")


# --- summary -----------------------------------------------------------------------------------

def summary_view(report: Report, style: Style = Style()) -> str:
    """Model-wide numbers: params, MACs, FLOPs, bytes, coverage, and runtime when measured."""
    total, s = report.total, style
    rows = [
        ["inputs", ", ".join(f"{t.dtype}[{', '.join(map(str, t.shape))}]" for t in report.inputs),
         ""],
        *_sizes_rows(report),
        ["params", s.count(report.params), _tied_note(report)],
        ["MACs", s.count(total.macs, "MACs"), "multiply-accumulates of matmul, conv, attention"],
        ["FLOPs", s.count(total.flops),
         "all ops, forward + backward" if report.mode == "train" else "all ops"],
        ["matmul FLOPs", s.count(total.matmul_flops), "2 per MAC: the matmul family alone"],
    ]
    if report.mode == "train":
        rows += _train_rows(report, style)
    if total.masked_flops:
        rows.append(["causal-effective FLOPs", s.count(total.causal_effective_flops),
                     f"without the {s.count(total.masked_flops)} FLOPs a causal mask discards"])
    rows += [
        ["bytes read", s.count(total.bytes_read, "B"), "each op's inputs, read once per op"],
        ["bytes written", s.count(total.bytes_written, "B"), "each op's outputs"],
        ["coverage", s.percent(report.coverage, 1), _coverage_note(report)],
        ["uncounted ops", sum(u.calls for u in report.uncounted), _uncounted_note(report)],
        *_value_guard_rows(report),
        *_capture_rows(report),
        *collective_summary_rows(report, style),
    ]
    if report.runtime is not None:
        rows += _runtime_rows(report, style)
    rows.append(["versions", f"torch {report.torch_version}",
                 f"exportflops {report.exportflops_version}"])
    return style.titled(f"Summary of {report.model}",
                        style.table(rows, ["", "value", "note"], "lrl"))


def _coverage_note(report: Report) -> str:
    statuses = Counter(n.status for n in report.nodes)
    arithmetic = statuses["counted"] + statuses["uncounted"] + statuses["error"]
    return f"of {arithmetic} arithmetic nodes; {statuses['zero']} free ones left out"


def _train_rows(report: Report, style: Style) -> list[list]:
    forward, backward, s = report.forward, report.backward, style
    split = [] if report.backward_weight is None else [
        ["backward: input / weight pass", f"{s.count(report.backward_input.flops)} / "
         f"{s.count(report.backward_weight.flops)}",
         "FLOPs of the two passes torch's zero-bubble schedules run (split_backward)"]]
    return [
        ["forward FLOPs", s.count(forward.flops),
         f"matmul {s.count(forward.matmul_flops)}; the rows above are forward + backward"],
        ["backward FLOPs", s.count(backward.flops),
         f"matmul {s.count(backward.matmul_flops)}; the ops autograd runs for the gradients"],
        ["backward / forward", s.ratio(backward.flops, forward.flops),
         f"matmul {s.ratio(backward.matmul_flops, forward.matmul_flops)}; "
         "frozen parameters and inputs without grad lower it below 2"],
        *split,
    ]


def _sizes_rows(report: Report) -> list[list]:
    """The dynamic sizes the counts are expressions of, with the example the views rank by; a
    size read from values has none (its counts rank last), and a run of real tensors measures
    it."""
    rows = []
    for size in report.symbols:
        low = "?" if size.min is None else size.min
        high = "?" if size.max is None else size.max
        ranked = ("; they rank last, and real tensors (the command's --device cpu) have it "
                  "measured on the example" if size.example is None
                  else ", rankings use the example value")
        rows.append([f"size {size.name}",
                     "data-dependent" if size.example is None else size.example,
                     f"allowed {low}..{high}; counts below are expressions of it{ranked}"])
    return rows


def _value_guard_rows(report: Report) -> list[list]:
    if not report.value_guards:
        return []
    shown = report.value_guards[:SHOWN_VALUE_GUARDS]
    rest = len(report.value_guards) - len(shown)
    more = f"; and {rest} more (Report.value_guards lists them all)" if rest else ""
    return [["decided by values", len(report.value_guards),
             "branches and sizes the example's values decided, counted as it takes them: "
             + "; ".join(shown) + more]]


def _capture_rows(report: Report) -> list[list]:
    """How the call was captured, where it is not the plain export of the call as given: an
    eager run of a model export refused, a ``use_cache=False`` the call was given."""
    if report.capture == "export" and not report.capture_notes:
        return []
    how = "eager run" if report.capture == "eager" else "torch.export"
    return [["captured by", how, "; ".join(report.capture_notes)]]


def _tied_note(report: Report) -> str:
    if not report.tied_parameters:
        return "no tied parameters"
    tied = ", ".join(f"{t.name} = {t.counted_as}" for t in report.tied_parameters)
    return f"tied counted once: {tied}"


def _uncounted_note(report: Report) -> str:
    if not report.uncounted:
        return "none: every node is counted"
    listed = "; ".join(f"{u.op} x{u.calls} ({u.reason})" for u in report.uncounted)
    return f"missing from every total: {listed}"


def _runtime_rows(report: Report, style: Style) -> list[list]:
    runtime, s = report.runtime, style
    plain = runtime.plain_total
    if runtime.mfu is None:
        mfu_note = "no peak FLOP/s known for this device: pass peak_flop_per_s= to profile()"
    else:
        mfu_note = (f"of {s.count(runtime.peak_flop_per_s, 'FLOP/s')} dense peak "
                    f"({runtime.peak_source})")
    return [
        ["device", runtime.device,
         f"{runtime.timer}, {runtime.warmup} warmup + {runtime.repeat} measured iterations"],
        ["latency", s.seconds(plain.median_s),
         f"plain forward, median (min {s.seconds(plain.min_s)}, max {s.seconds(plain.max_s)})"],
        ["achieved FLOP/s", s.count(runtime.achieved_flop_per_s, "FLOP/s"),
         "model FLOPs / latency"],
        ["MFU", "-" if runtime.mfu is None else s.percent(runtime.mfu, 1), mfu_note],
        ["timing overhead", s.seconds(runtime.overhead_s),
         f"per-node timing minus plain forward; {s.seconds(runtime.residual_s)} of the forward "
         f"is in no node"],
    ]


# --- operators ---------------------------------------------------------------------------------

_COST_HEADERS = ["op", "calls", "FLOPs", "% FLOPs", "MACs", "% MACs", "bytes read",
                 "bytes written"]


def operators_view(report: Report, style: Style = Style()) -> str:
    """Cost per op, most FLOPs first; the last row is the model total."""
    uncounted = {u.op: u.reason for u in report.uncounted}
    rows = []
    for op, stats in sorted(report.operators.items(), key=_by_cost(report)):
        rows.append(_cost_row(op, stats.calls, stats.cost, report, style)
                    + [f"uncounted: {uncounted[op]}" if op in uncounted else ""])
    rows.append(_cost_row("total", len(report.nodes), report.total, report, style) + [""])
    return style.titled("Operators: cost per op over the whole model",
                        style.table(rows, _COST_HEADERS + ["note"], "lrrrrrrrl"))


def _cost_row(name: str, calls: int, cost: Cost, report: Report, style: Style) -> list:
    total = report.total
    return [name, calls, style.count(cost.flops), style.percent(cost.flops, total.flops),
            style.count(cost.macs, "MACs"), style.percent(cost.macs, total.macs),
            style.count(cost.bytes_read, "B"), style.count(cost.bytes_written, "B")]


def module_operators_view(report: Report, style: Style = Style(), *, depth: int = -1,
                          ignore_modules: Collection[str] = ()) -> str:
    """Per module (tree order, down to ``depth``), its inclusive cost per op; ops with no cost
    at all (views) are left out, uncounted ones kept."""
    tree = ModuleTree.of(report, ignore_modules)
    uncounted = {u.op for u in report.uncounted}
    rows = []

    def visit(path: str) -> None:
        record = tree.records[path]
        if depth >= 0 and record.depth > depth:
            return
        ops = [(op, s) for op, s in record.operators.items()
               if s.cost != Cost() or op in uncounted]
        ops.sort(key=_by_cost(report))
        for i, (op, stats) in enumerate(ops):
            row = _cost_row(op, stats.calls, stats.cost, report, style)
            rows.append([(path or root_label(report, record)) if i == 0 else ""] + row
                        + ["uncounted" if op in uncounted else ""])
        for child in tree.children.get(path, []):
            visit(child)

    visit("")
    return style.titled("Operators per module: inclusive cost of each op in the module",
                        style.table(rows, ["module"] + _COST_HEADERS + ["note"], "llrrrrrrrl"))


def _by_cost(report: Report) -> Callable[[tuple[str, Any]], tuple]:
    """Sort key of ``(op, OperatorStats)`` items: most FLOPs first, then most bytes, then name."""
    value_of = magnitude(report)
    return lambda item: (-value_of(item[1].cost.flops), -value_of(item[1].cost.bytes_read),
                         item[0])


# --- CSV and DataFrames ------------------------------------------------------------------------

#: The row kinds of `to_csv` and `to_pandas` for a `Report`.
ROW_KINDS = ("modules", "operators", "nodes")


def table_rows(report: Report | GenerationReport, rows: str | None,
               caller: str) -> tuple[list[str], list[list]]:
    """The header and the rows of `to_csv` and `to_pandas` (one builder, so a CSV and a
    DataFrame have the same columns): raw counts in base units (FLOPs, MACs, bytes, seconds),
    a count of dynamic sizes as its expression, None where there is no value.

    A `Report` has one row per module (``rows=None`` or ``"modules"``), per op or per node; in
    train mode the modules and ops add the ``backward_*`` part of their counts. A
    `GenerationReport` has one row per step (``"steps"``, see `generation_rows`)."""
    if isinstance(report, GenerationReport):
        if rows not in (None, "steps"):
            raise ValueError(f"a GenerationReport has one row per step: rows='steps', got "
                             f"{rows!r}")
        return generation_rows(report)
    require_report(report, caller)
    builders = {"modules": _module_rows, "operators": _operator_rows, "nodes": _node_rows}
    kind = "modules" if rows is None else rows
    if kind not in builders:
        raise ValueError(f"rows must be one of {', '.join(map(repr, ROW_KINDS))}, got {rows!r}")
    return builders[kind](report)


def _counts(cost: Cost) -> list:
    return [getattr(cost, field) for field in _FIELDS]


_FIELDS = list(Cost.model_fields)


def _module_rows(report: Report) -> tuple[list[str], list[list]]:
    timed = {t.path: t for t in report.runtime.modules} if report.runtime else None
    train = report.mode == "train"
    header = (["path", "type", "depth", "calls", "params", "own_params"]
              + [f"inclusive_{f}" for f in _FIELDS] + [f"exclusive_{f}" for f in _FIELDS]
              + ([f"backward_{f}" for f in _FIELDS] if train else [])
              + (["inclusive_s", "exclusive_s"] if timed is not None else []))
    body = []
    for m in report.modules:
        row = ([m.path, m.type, m.depth, m.calls, m.params, m.own_params]
               + _counts(m.inclusive) + _counts(m.exclusive)
               + (_counts(m.backward) if train else []))
        if timed is not None:
            t = timed.get(m.path)
            row += [t.inclusive_s, t.exclusive_s] if t else [None, None]
        body.append(row)
    return header, body


def _operator_rows(report: Report) -> tuple[list[str], list[list]]:
    uncounted = {u.op: u.reason for u in report.uncounted}
    train = report.mode == "train"
    header = (["op", "calls"] + _FIELDS
              + (["backward_calls"] + [f"backward_{f}" for f in _FIELDS] if train else [])
              + ["uncounted"])
    body = [[op, stats.calls] + _counts(stats.cost)
            + ([stats.backward_calls] + _counts(stats.backward) if train else [])
            + [uncounted.get(op, "")]
            for op, stats in report.operators.items()]
    return header, body


def _node_rows(report: Report) -> tuple[list[str], list[list]]:
    depth = {m.path: m.depth for m in report.modules}
    timed = {t.name: t for t in report.runtime.nodes} if report.runtime else None
    header = (["node", "op", "module", "depth", "status", "phase"] + _FIELDS + ["note"]
              + (["median_s"] if timed is not None else []))
    body = []
    for n in report.nodes:
        row = [n.name, n.op, n.module, depth.get(n.module), n.status, n.phase,
               *_counts(n.cost), n.note]
        if timed is not None:
            t = timed.get(n.name)
            row.append(t.latency.median_s if t else None)
        body.append(row)
    return header, body


def to_csv(report: Report | GenerationReport, rows: str | None = None) -> str:
    """One row per module (the default; ``inclusive_*`` and ``exclusive_*`` counts, the
    exclusive columns sum to the model total), per op (``rows="operators"``) or per node
    (``rows="nodes"``), raw integers, with a header row; a `GenerationReport` one row per step.
    The columns are `to_pandas`'s (docs/reports.md lists them)."""
    header, body = table_rows(report, rows, "to_csv")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body)  # None is written as an empty cell, an expression as its text
    return out.getvalue()


def to_pandas(report: Report | GenerationReport, rows: str | None = None) -> Any:
    """The rows of `to_csv` as a pandas DataFrame, same columns (needs ``pip install
    'exportflops[pandas]'``). Counts are integers in base units; a count of dynamic sizes
    stays its sympy expression (``report.evaluate(seq=...)`` first for numbers)."""
    header, body = table_rows(report, rows, "to_pandas")
    return optional_module("pandas", needed_by="to_pandas", extra="pandas").DataFrame(
        body, columns=header)


#: The model totals a sweep shows at each point: (heading, Cost field, unit).
_SWEEP_COLUMNS = (("MACs", "macs", "MACs"), ("FLOPs", "flops", ""),
                  ("bytes read", "bytes_read", "B"), ("bytes written", "bytes_written", "B"))


def sweep_view(reports: list[Report], points: dict[str, list[int]],
               tablefmt: str = "simple") -> str:
    """One row per point of a sweep (``report.sweep(seq=[...])``): the sizes, then the model's
    MACs, FLOPs and bytes at them. ``tablefmt="csv"`` writes raw integers as CSV."""
    for report in reports:
        require_report(report, "sweep_view")
    names = list(points)
    headers = names + [heading for heading, _, _ in _SWEEP_COLUMNS]
    style = Style(tablefmt=tablefmt, as_string=tablefmt != "csv")
    rows = [[points[name][i] for name in names]
            + [style.count(getattr(report.total, field), unit)
               for _, field, unit in _SWEEP_COLUMNS]
            for i, report in enumerate(reports)]
    if tablefmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([headers, *rows])
        return out.getvalue().rstrip("\n")
    model = reports[0].model if reports else ""
    return style.titled(f"Sweep of {model}: whole-model totals at each size",
                        style.table(rows, headers, "r" * len(headers)))
