"""Report -> text tables, CSV and Markdown. The only importer of tabulate; imports no torch.

Every view is a pure function of a `Report` (and the display options): it reads the totals the
report holds and never recomputes one, so a printed total is the report's own. Counts of dynamic
sizes are written as their expressions and ranked at the sizes the graph was exported with. Percentages are
of the model's totals (``report.total``, ``report.params``). `flops_report` joins views and is the
only function here that prints or writes a file, and only when asked.

Views, after DeepSpeed's flops profiler and fvcore:

- ``summary``: params, MACs, FLOPs (all ops and matmul family), bytes, coverage, and the
  measured latency, achieved FLOP/s and MFU when ``report.runtime`` is set;
- ``top``: for each depth, the top-k module types (or paths) by params, MACs, FLOPs and latency
  (DeepSpeed's "aggregated profile");
- ``tree``: every module, inclusive of its children, with the ops it runs itself (its
  functionals) and repeated identical siblings collapsed (DeepSpeed's "detailed profile");
- ``operators``: cost per op (fvcore's ``by_operator``), with the model total as the last row;
- ``module_operators``: inclusive cost per module and op (fvcore's ``by_module_and_operator``).
"""

from __future__ import annotations

import csv
import io
import os
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import sympy
from tabulate import tabulate

from .records import Counts, ModuleRecord, Report, size_symbol

if TYPE_CHECKING:
    from .budgets.compare import Comparison

View = Literal["summary", "top", "tree", "operators", "module_operators"]
VIEWS: tuple[str, ...] = ("summary", "top", "tree", "operators", "module_operators")
DEFAULT_VIEWS: tuple[str, ...] = ("summary", "top", "tree")

# Decimal prefixes, largest first: counts and bytes are shown as k (1e3) to T (1e12).
_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


@dataclass(frozen=True)
class Style:
    """How cells and headings are written; one value passed down to every view."""

    tablefmt: str = "simple"
    """tabulate's table format, passed to each call (``github`` for Markdown)."""
    as_string: bool = True
    """Human-readable units (``4.09 GMACs``, ``1.23 ms``); raw ints and seconds when False."""
    indent: str = "  "
    """One level of the tree's indentation (``&nbsp;&nbsp;`` in Markdown, where spaces collapse)."""
    heading: str = ""
    """Prefix of a view's title line (``## `` in Markdown)."""

    def count(self, value: int | float | sympy.Expr, unit: str = "") -> str | int | float:
        """``8.24 G``, ``4.09 GMACs``, ``25.56 M``: 2 decimals with a k/M/G/T prefix; a count of
        a dynamic size is written as its expression (``5514*batch``)."""
        if not self.as_string:
            return value if isinstance(value, (int, float)) else str(value)
        if not isinstance(value, (int, float)):
            return f"{value} {unit}" if unit else str(value)
        for scale, prefix in _PREFIXES:
            if abs(value) >= scale:
                return f"{value / scale:.2f} {prefix}{unit}"
        number = str(value) if isinstance(value, int) else f"{value:.2f}"
        return f"{number} {unit}" if unit else number

    def seconds(self, value: float | None) -> str | float | None:
        if value is None or not self.as_string:
            return value
        if value >= 1:
            return f"{value:.2f} s"
        if value >= 1e-3:
            return f"{value * 1e3:.2f} ms"
        return f"{value * 1e6:.2f} us"

    def percent(self, part: Any, whole: Any) -> str | float | None:
        """``part`` as a percentage of ``whole``; ``-`` when there is no whole, or when the share
        of two dynamic counts depends on the sizes."""
        share = _constant(part / whole) if whole != 0 else None
        if share is None:
            return "-" if self.as_string else None
        return f"{100 * share:.2f}%" if self.as_string else round(100 * share, 2)

    def table(self, rows: list[list], headers: Sequence[str], align: str) -> str:
        """One tabulate call; ``align`` is one letter per column, ``l`` or ``r``."""
        return tabulate(rows, headers=list(headers), tablefmt=self.tablefmt,
                        colalign=[{"l": "left", "r": "right"}[a] for a in align],
                        disable_numparse=True, preserve_whitespace=True, missingval="-")

    def titled(self, title: str, body: str) -> str:
        return f"{self.heading}{title}\n\n{body}" if self.heading else f"{title}\n{body}"


MARKDOWN = Style(tablefmt="github", indent="&nbsp;&nbsp;", heading="## ")


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
        ["coverage", s.percent(report.coverage, 1),
         f"of {len(report.nodes)} graph nodes counted or declared free"],
        ["uncounted ops", sum(u.calls for u in report.uncounted), _uncounted_note(report)],
    ]
    if report.runtime is not None:
        rows += _runtime_rows(report, style)
    rows.append(["versions", f"torch {report.torch_version}",
                 f"exportflops {report.exportflops_version}"])
    return style.titled(f"Summary of {report.model}",
                        style.table(rows, ["", "value", "note"], "lrl"))


def _train_rows(report: Report, style: Style) -> list[list]:
    forward, backward, s = report.forward, report.backward, style
    return [
        ["forward FLOPs", s.count(forward.flops),
         f"matmul {s.count(forward.matmul_flops)}; the rows above are forward + backward"],
        ["backward FLOPs", s.count(backward.flops),
         f"matmul {s.count(backward.matmul_flops)}; the ops autograd runs for the gradients"],
        ["backward / forward", _ratio(backward.flops, forward.flops, s),
         f"matmul {_ratio(backward.matmul_flops, forward.matmul_flops, s)}; "
         "frozen parameters and inputs without grad lower it below 2"],
    ]


def _ratio(part: Any, whole: Any, style: Style) -> str | float | None:
    ratio = _constant(part / whole) if whole != 0 else None
    if ratio is None:
        return "-" if style.as_string else None
    return f"{ratio:.3f}" if style.as_string else ratio


def _sizes_rows(report: Report) -> list[list]:
    """The dynamic sizes the counts are expressions of, with the example the views rank by."""
    rows = []
    for size in report.symbols:
        low = "?" if size.min is None else size.min
        high = "?" if size.max is None else size.max
        rows.append([f"size {size.name}",
                     "data-dependent" if size.example is None else size.example,
                     f"allowed {low}..{high}; counts below are expressions of it, rankings use "
                     f"the example value"])
    return rows


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
        mfu_note = "no peak FLOP/s known for this device: pass peak_flops= to profile()"
    else:
        mfu_note = f"of {s.count(runtime.peak_flop_per_s, 'FLOPS')} dense peak ({runtime.peak_source})"
    return [
        ["device", runtime.device,
         f"{runtime.timer}, {runtime.warmup} warmup + {runtime.repeat} measured iterations"],
        ["latency", s.seconds(plain.median_s),
         f"plain forward, median (min {s.seconds(plain.min_s)}, max {s.seconds(plain.max_s)})"],
        ["achieved FLOP/s", s.count(runtime.achieved_flop_per_s, "FLOPS"),
         "model FLOPs / latency"],
        ["MFU", "-" if runtime.mfu is None else s.percent(runtime.mfu, 1), mfu_note],
        ["timing overhead", s.seconds(runtime.overhead_s),
         f"per-node timing minus plain forward; {s.seconds(runtime.residual_s)} of the forward "
         f"is in no node"],
    ]


# --- module tree -------------------------------------------------------------------------------

@dataclass
class _OwnOp:
    """Calls and summed cost of one op's nodes in one module (or a run of identical ones)."""

    calls: int = 0
    cost: Counts = Counts()
    uncounted: bool = False

    def add(self, calls: int, cost: Counts, uncounted: bool) -> None:
        self.calls += calls
        self.cost += cost
        self.uncounted |= uncounted


@dataclass(frozen=True)
class _Tree:
    """The report's modules as a tree: children in the order they first ran."""

    report: Report
    records: dict[str, ModuleRecord]
    children: dict[str, list[str]]
    own_ops: dict[str, dict[str, _OwnOp]]
    """path -> op -> the nodes of that op the module runs itself."""
    first_run: dict[str, int]
    """path -> index of the first node run in the module or under it; absent: it did not run."""
    latency: dict[str, float]
    """path -> inclusive seconds, when measured."""
    magnitude: Callable[[Any], float]
    """A count's value for ranking (see `_magnitude`)."""

    @classmethod
    def of(cls, report: Report, ignore_types: Collection[str] = ()) -> _Tree:
        records = {m.path: m for m in report.modules}
        first_run: dict[str, int] = {}
        own_ops: dict[str, dict[str, _OwnOp]] = defaultdict(lambda: defaultdict(_OwnOp))
        for index, node in enumerate(report.nodes):
            path = node.module
            while path not in first_run:  # every enclosing module first ran here or earlier
                first_run[path] = index
                if not path:
                    break
                path = _parent(path)
            own_ops[node.module][node.op].add(1, node.cost, node.status in ("uncounted", "error"))
        children: dict[str, list[str]] = defaultdict(list)
        for m in report.modules:
            if m.path and not _ignored(m, ignore_types):
                children[_parent(m.path)].append(m.path)
        never_ran = len(report.nodes)
        for paths in children.values():
            paths.sort(key=lambda p: (first_run.get(p, never_ran), _natural(p)))
        latency = ({t.path: t.inclusive_s for t in report.runtime.modules}
                   if report.runtime is not None else {})
        return cls(report, records, children, own_ops, first_run, latency, _magnitude(report))

    def signature(self, path: str) -> tuple:
        """What must match for two sibling subtrees to be shown as one row: names below the
        module, types, calls, params and every count."""
        def rows(p: str, rel: str):
            m = self.records[p]
            yield (rel, m.type, m.calls, m.params, m.own_params, tuple(m.tied_params),
                   m.inclusive, m.exclusive, tuple(sorted(m.operators.items())))
            for child in self.children.get(p, []):
                yield from rows(child, rel + child[len(p):])
        return tuple(rows(path, ""))


@dataclass(frozen=True)
class _Group:
    """One row of the tree: a module, or a run of identical siblings shown once, summed."""

    paths: tuple[str, ...]
    """The modules this row sums; for a collapsed run, the instances' paths in order."""
    label: str


def tree_view(report: Report, style: Style = Style(), *, depth: int = -1, collapse: bool = True,
              ignore_modules: Collection[str] = (),
              extra_reprs: Mapping[str, str] | None = None) -> str:
    """Every module with params, MACs, FLOPs (inclusive) and their share of the model, its
    functionals (ops it runs itself), latency and achieved FLOP/s when measured, down to
    ``depth`` (-1: all). ``collapse`` shows a run of identical numbered siblings as one row
    ``(1)..(11): Block x 11`` whose numbers, and those of the rows under it, are summed over the
    run. ``extra_reprs`` maps a module path to its ``extra_repr()``, shown in a last column."""
    tree = _Tree.of(report, ignore_modules)
    measured = report.runtime is not None
    root_latency = tree.latency.get("")
    headers = ["module", "params", "% params", "MACs", "% MACs", "FLOPs", "% FLOPs"]
    align = "lrrrrrr"
    train = report.mode == "train"
    if train:
        headers += ["backward FLOPs", "bwd / fwd"]
        align += "rr"
    if measured:
        headers += ["latency", "% latency", "FLOPS"]
        align += "rrr"
    headers.append("functionals")
    align += "l"
    if extra_reprs is not None:
        headers.append("extra repr")
        align += "l"

    rows = []

    def emit(group: _Group, level: int) -> None:
        records = [tree.records[p] for p in group.paths]
        inclusive = sum((m.inclusive for m in records), Counts())
        params = sum(m.params for m in records)
        row = [style.indent * level + group.label,
               style.count(params), style.percent(params, report.params),
               style.count(inclusive.macs, "MACs"), style.percent(inclusive.macs, report.total.macs),
               style.count(inclusive.flops), style.percent(inclusive.flops, report.total.flops)]
        if train:
            backward = sum((m.backward for m in records), Counts())
            row += [style.count(backward.flops),
                    _ratio(backward.flops, inclusive.flops - backward.flops, style)]
        if measured:
            seconds = [tree.latency[p] for p in group.paths if p in tree.latency]
            latency = sum(seconds) if seconds else None
            row += [style.seconds(latency),
                    None if latency is None or root_latency is None
                    else style.percent(latency, root_latency),
                    style.count(inclusive.flops / latency, "FLOPS") if latency else None]
        row.append(_functionals(tree, group.paths, style))
        if extra_reprs is not None:
            row.append(extra_reprs.get(group.paths[0], ""))
        rows.append(row)
        if depth >= 0 and level >= depth:
            return
        for child in _child_groups(tree, group, collapse):
            emit(child, level + 1)

    emit(_Group(("",), _root_label(report, tree.records[""])), 0)
    return style.titled(
        "Module tree: inclusive counts (a row includes the rows under it); functionals: the ops "
        "a module runs itself, outside its children",
        style.table(rows, headers, align))


def _child_groups(tree: _Tree, group: _Group, collapse: bool) -> list[_Group]:
    """The rows under ``group``: its first instance's children, each summed over the instances,
    with runs of identical numbered siblings merged when ``collapse``."""
    first = group.paths[0]
    names = [child[len(first) + 1 if first else 0:] for child in tree.children.get(first, [])]
    runs: list[list[str]] = []
    for name in names:
        run = runs[-1] if runs else None
        if (collapse and run and name.isdigit() and run[-1].isdigit()
                and int(name) == int(run[-1]) + 1
                and tree.signature(_join(first, name)) == tree.signature(_join(first, run[0]))):
            run.append(name)
        else:
            runs.append([name])
    groups = []
    for run in runs:
        paths = tuple(_join(parent, name) for name in run for parent in group.paths)
        record = tree.records[paths[0]]
        type_name = _short_type(record.type)
        if len(run) > 1:
            label = f"({run[0]})..({run[-1]}): {type_name} x {len(run)}"
        else:
            label = f"({run[0]}): {type_name}" if type_name else f"({run[0]})"
            label += _calls_note(record, ran=paths[0] in tree.first_run)
        groups.append(_Group(paths, label))
    return groups


def _functionals(tree: _Tree, paths: Sequence[str], style: Style) -> str:
    """``add.Tensor x2: 1.57 M``: the ops with FLOPs (or uncounted) the modules run themselves.

    A leaf module that runs a single op (a Linear) shows none: its row is that op already."""
    merged: dict[str, _OwnOp] = defaultdict(_OwnOp)
    for path in paths:
        for op, own in tree.own_ops.get(path, {}).items():
            merged[op].add(own.calls, own.cost, own.uncounted)
    shown = sorted(((op, own) for op, own in merged.items() if own.cost.flops or own.uncounted),
                   key=lambda item: -tree.magnitude(item[1].cost.flops))
    if len(shown) == 1 and not tree.children.get(paths[0]) and not shown[0][1].uncounted:
        return ""
    parts = []
    for op, own in shown:
        times = f" x{own.calls}" if own.calls > 1 else ""
        value = "uncounted" if own.uncounted else style.count(own.cost.flops)
        parts.append(f"{_short_op(op)}{times}: {value}")
    return ", ".join(parts)


def _root_label(report: Report, root: ModuleRecord) -> str:
    return _short_type(root.type) or report.model


def _calls_note(record: ModuleRecord, ran: bool) -> str:
    """`` (4 calls)``, `` (did not run)``, `` (tied: weight)``; nothing for one call or for a
    container (a ModuleList is never called itself, its children are)."""
    notes = []
    if not ran:
        notes.append("did not run")
    elif record.calls > 1:
        notes.append(f"{record.calls} calls")
    if record.tied_params:
        notes.append(f"tied: {', '.join(record.tied_params)}")
    return f" ({'; '.join(notes)})" if notes else ""


# --- top modules per depth ---------------------------------------------------------------------

def top_view(report: Report, style: Style = Style(), *, top: int = 3, depth: int = -1,
             group_by: Literal["type", "path"] = "type",
             ignore_modules: Collection[str] = ()) -> str:
    """For each depth (0 .. ``depth``, -1: all), the ``top`` module types (or paths) by params,
    MACs, FLOPs and, when measured, latency; a type's value sums its modules at that depth."""
    if group_by not in ("type", "path"):
        raise ValueError(f"group_by must be 'type' or 'path', got {group_by!r}")
    tree = _Tree.of(report, ignore_modules)
    shown = _visible(tree)
    latency = tree.latency
    # (column, value of a group of modules, how to write it)
    metrics = [
        ("params", lambda ms: sum(m.params for m in ms), style.count),
        ("MACs", lambda ms: sum(m.inclusive.macs for m in ms), lambda v: style.count(v, "MACs")),
        ("FLOPs", lambda ms: sum(m.inclusive.flops for m in ms), style.count),
    ]
    if report.runtime is not None:
        metrics.append(("latency", lambda ms: sum(latency.get(m.path, 0.0) for m in ms),
                        style.seconds))
    by_depth: dict[int, dict[str, list[ModuleRecord]]] = defaultdict(lambda: defaultdict(list))
    for m in shown:
        if depth < 0 or m.depth <= depth:
            key = (_short_type(m.type) or "?") if group_by == "type" else (m.path or report.model)
            by_depth[m.depth][key].append(m)

    rows = []
    for level in sorted(by_depth):
        groups = by_depth[level]
        columns = []
        for _, value, fmt in metrics:
            ranked = sorted(((value(ms), key) for key, ms in groups.items()),
                            key=lambda item: (-tree.magnitude(item[0]), _natural(item[1])))
            k = len(ranked) if top < 0 else min(top, len(ranked))
            columns.append([f"{key}: {fmt(v)}" for v, key in ranked[:k]])
        for rank in range(max(len(c) for c in columns)):
            rows.append([level if rank == 0 else "", rank + 1]
                        + [c[rank] if rank < len(c) else "" for c in columns])
    what = "module types" if group_by == "type" else "modules"
    which = f"All {what}" if top < 0 else f"The top {top} {what}"
    return style.titled(
        f"{which} at each depth by " + ", ".join(name for name, _, _ in metrics)
        + (" (a type's value sums its modules at that depth)" if group_by == "type" else ""),
        style.table(rows, ["depth", "rank"] + [name for name, _, _ in metrics],
                    "rr" + "l" * len(metrics)))


def _visible(tree: _Tree) -> list[ModuleRecord]:
    """The root and every module not left out by ``ignore_modules`` (nor under one)."""
    out, stack = [], [""]
    while stack:
        path = stack.pop()
        out.append(tree.records[path])
        stack.extend(tree.children.get(path, []))
    return out


# --- operators ---------------------------------------------------------------------------------

def operators_view(report: Report, style: Style = Style()) -> str:
    """Cost per op, most FLOPs first; the last row is the model total."""
    uncounted = {u.op: u.reason for u in report.uncounted}
    total = report.total
    rows = []
    ranked = sorted(report.operators.items(), key=_by_cost(report))
    for op, stats in ranked:
        rows.append(_cost_row(op, stats.calls, stats.cost, report, style)
                    + [f"uncounted: {uncounted[op]}" if op in uncounted else ""])
    rows.append(_cost_row("total", len(report.nodes), total, report, style) + [""])
    return style.titled("Operators: cost per op over the whole model",
                        style.table(rows, _COST_HEADERS + ["note"], "lrrrrrrrl"))


_COST_HEADERS = ["op", "calls", "FLOPs", "% FLOPs", "MACs", "% MACs", "bytes read",
                 "bytes written"]


def _cost_row(name: str, calls: int, cost: Counts, report: Report, style: Style) -> list:
    total = report.total
    return [name, calls, style.count(cost.flops), style.percent(cost.flops, total.flops),
            style.count(cost.macs, "MACs"), style.percent(cost.macs, total.macs),
            style.count(cost.bytes_read, "B"), style.count(cost.bytes_written, "B")]


def module_operators_view(report: Report, style: Style = Style(), *, depth: int = -1,
                          ignore_modules: Collection[str] = ()) -> str:
    """Per module (tree order, down to ``depth``), its inclusive cost per op; ops with no cost
    at all (views) are left out, uncounted ones kept."""
    tree = _Tree.of(report, ignore_modules)
    uncounted = {u.op for u in report.uncounted}
    rows = []

    def visit(path: str) -> None:
        record = tree.records[path]
        if depth >= 0 and record.depth > depth:
            return
        ops = [(op, s) for op, s in record.operators.items()
               if s.cost != Counts() or op in uncounted]
        ops.sort(key=_by_cost(report))
        for i, (op, stats) in enumerate(ops):
            row = _cost_row(op, stats.calls, stats.cost, report, style)
            rows.append([(path or _root_label(report, record)) if i == 0 else ""] + row
                        + ["uncounted" if op in uncounted else ""])
        for child in tree.children.get(path, []):
            visit(child)

    visit("")
    return style.titled("Operators per module: inclusive cost of each op in the module",
                        style.table(rows, ["module"] + _COST_HEADERS + ["note"], "llrrrrrrrl"))


# --- all views, CSV, Markdown ------------------------------------------------------------------

def render(report: Report, style: Style = Style(), *,
           view: str | Sequence[str] = DEFAULT_VIEWS, depth: int = -1, top: int = 3,
           group_by: Literal["type", "path"] = "type", collapse: bool = True,
           ignore_modules: Collection[str] = (),
           extra_reprs: Mapping[str, str] | None = None) -> str:
    """The views named in ``view``, in that order, separated by a blank line."""
    parts = []
    for name in _views(view):
        if name == "summary":
            parts.append(summary_view(report, style))
        elif name == "top":
            parts.append(top_view(report, style, top=top, depth=depth, group_by=group_by,
                                  ignore_modules=ignore_modules))
        elif name == "tree":
            parts.append(tree_view(report, style, depth=depth, collapse=collapse,
                                   ignore_modules=ignore_modules, extra_reprs=extra_reprs))
        elif name == "operators":
            parts.append(operators_view(report, style))
        else:
            parts.append(module_operators_view(report, style, depth=depth,
                                               ignore_modules=ignore_modules))
    return "\n\n".join(parts) + "\n"


def flops_report(report: Report, *, view: str | Sequence[str] = DEFAULT_VIEWS, depth: int = -1,
                 top: int = 3, group_by: Literal["type", "path"] = "type",
                 tablefmt: str = "simple", as_string: bool = True, collapse: bool = True,
                 ignore_modules: Collection[str] = (),
                 extra_reprs: Mapping[str, str] | None = None,
                 output_file: str | os.PathLike | None = None,
                 print_output: bool = False) -> str:
    """The report as text tables, DeepSpeed-profiler style; returns the text.

    ``view``: one or more of ``summary``, ``top``, ``tree``, ``operators``,
    ``module_operators``. ``depth`` limits the tree and the per-depth views (-1: all); ``top`` is
    the number of module types per depth (-1: all), grouped by class name or, with
    ``group_by="path"``, by module path. ``as_string=False`` writes raw integers (and seconds)
    instead of ``4.09 GMACs``. ``ignore_modules`` leaves module types (class names, short or
    qualified) and everything under them out of the module views; totals stay the model's.
    ``extra_reprs`` (path -> ``module.extra_repr()``) adds a column to the tree. The text is
    written to ``output_file`` and printed with ``print_output=True``; otherwise nothing is.
    """
    text = render(report, Style(tablefmt=tablefmt, as_string=as_string), view=view, depth=depth,
                  top=top, group_by=group_by, collapse=collapse, ignore_modules=ignore_modules,
                  extra_reprs=extra_reprs)
    if output_file is not None:
        with open(output_file, "w", encoding="utf-8") as f:
            f.write(text)
    if print_output:
        print(text, end="")
    return text


def to_markdown(report: Report, *, view: str | Sequence[str] = DEFAULT_VIEWS, depth: int = -1,
                top: int = 3, group_by: Literal["type", "path"] = "type", collapse: bool = True,
                ignore_modules: Collection[str] = (),
                extra_reprs: Mapping[str, str] | None = None) -> str:
    """The same views as GitHub Markdown: a title, then a ``##`` section and table per view."""
    body = render(report, MARKDOWN, view=view, depth=depth, top=top, group_by=group_by,
                  collapse=collapse, ignore_modules=ignore_modules, extra_reprs=extra_reprs)
    return f"# exportflops report: {report.model}\n\n{body}"


def to_csv(report: Report, rows: Literal["modules", "operators"] = "modules") -> str:
    """One row per module (``inclusive_*`` and ``exclusive_*`` counts; the exclusive columns sum
    to the model total) or per op, raw integers, with a header row."""
    fields = list(Counts.model_fields)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if rows == "modules":
        timed = {t.path: t for t in report.runtime.modules} if report.runtime else None
        header = (["path", "type", "depth", "calls", "params", "own_params"]
                  + [f"inclusive_{f}" for f in fields] + [f"exclusive_{f}" for f in fields])
        writer.writerow(header + (["inclusive_s", "exclusive_s"] if timed is not None else []))
        for m in report.modules:
            row = ([m.path, m.type, m.depth, m.calls, m.params, m.own_params]
                   + [getattr(m.inclusive, f) for f in fields]
                   + [getattr(m.exclusive, f) for f in fields])
            if timed is not None:
                t = timed.get(m.path)
                row += [t.inclusive_s, t.exclusive_s] if t else ["", ""]
            writer.writerow(row)
    elif rows == "operators":
        uncounted = {u.op: u.reason for u in report.uncounted}
        writer.writerow(["op", "calls"] + fields + ["uncounted"])
        for op, stats in report.operators.items():
            writer.writerow([op, stats.calls] + [getattr(stats.cost, f) for f in fields]
                            + [uncounted.get(op, "")])
    else:
        raise ValueError(f"rows must be 'modules' or 'operators', got {rows!r}")
    return out.getvalue()


# --- budgets ---------------------------------------------------------------------------------

def comparison_table(comparison: Comparison, tablefmt: str = "simple",
                     reason_width: int | None = 60) -> str:
    """The comparison as a text table (tabulate's ``tablefmt``, e.g. ``github`` for Markdown):
    exact FLOPs with thousands separators, the relative difference in percent, reasons wrapped
    at ``reason_width`` characters."""
    c = comparison
    title = (f"{c.source} vs the exported graph of {c.model}"
             + (f"; budgeted for {c.config.name}" if c.config.name else ""))
    rows = [[r.component, f"{r.budget_flops:,}", f"{r.counted_flops:,}", f"{r.diff_flops:+,}",
             "-" if r.rel_diff is None else f"{r.rel_diff:+.2%}", r.reason] for r in c.rows]
    table = tabulate(rows, headers=["component", "budget FLOPs", "graph FLOPs", "difference",
                                    "relative", "reason"],
                     tablefmt=tablefmt, colalign=("left", "right", "right", "right", "right",
                                                  "left"),
                     maxcolwidths=[None, None, None, None, None, reason_width])
    return f"{title}\n{table}"


# --- helpers -----------------------------------------------------------------------------------

def _constant(value: Any) -> float | None:
    """A number as a float; None for an expression that still depends on a dynamic size."""
    if isinstance(value, (int, float)):
        return float(value)
    value = sympy.cancel(value)
    return float(value) if value.is_number else None


def _magnitude(report: Report) -> Callable[[Any], float]:
    """A count's value for ranking rows: itself, or for a count of dynamic sizes its value at the
    example sizes the graph was exported with. A count that still depends on a data-dependent
    size (one with no example) ranks as 0, last, rather than breaking the sort."""
    examples = {size_symbol(s.name): s.example for s in report.symbols if s.example is not None}

    def magnitude(count: Any) -> float:
        if isinstance(count, (int, float)):
            return count
        value = count.xreplace(examples)
        return float(value) if value.is_number else 0.0
    return magnitude


def _by_cost(report: Report) -> Callable[[tuple[str, Any]], tuple]:
    """Sort key of ``(op, OperatorStats)`` items: most FLOPs first, then most bytes, then name."""
    magnitude = _magnitude(report)
    return lambda item: (-magnitude(item[1].cost.flops), -magnitude(item[1].cost.bytes_read),
                         item[0])


def _views(view: str | Sequence[str]) -> list[str]:
    names = [view] if isinstance(view, str) else list(view)
    for name in names:
        if name not in VIEWS:
            raise ValueError(f"unknown view {name!r}; choose from {', '.join(VIEWS)}")
    return names


def _ignored(record: ModuleRecord, ignore_types: Collection[str]) -> bool:
    return bool(ignore_types) and (record.type in ignore_types
                                   or _short_type(record.type) in ignore_types)


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _natural(path: str) -> list:
    """Sort key: ``h.2`` before ``h.10``."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split(".")]


def _short_type(qualname: str) -> str:
    """``torch.nn.modules.linear.Linear`` -> ``Linear``."""
    return qualname.rpartition(".")[2]


def _short_op(op: str) -> str:
    """``aten.add.Tensor`` -> ``add.Tensor``; ``aten.linear.default`` -> ``linear``."""
    return op.removeprefix("aten.").removesuffix(".default")
