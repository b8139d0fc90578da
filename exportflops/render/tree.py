"""The views shaped by the module tree: ``tree`` (every module, DeepSpeed's "detailed profile")
and ``top`` (the top-k module types per depth, DeepSpeed's "aggregated profile").

Every number shown is a `ModuleRecord`'s, summed over the rows a collapsed run shows once; the
only thing read from the nodes is the order in which modules first ran, to order siblings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..records.names import join, parent, short_name
from ..records import Cost, ModuleRecord, Report
from .format import Style, magnitude


@dataclass(frozen=True)
class ModuleTree:
    """The report's modules as a tree: children in the order they first ran."""

    records: dict[str, ModuleRecord]
    children: dict[str, list[str]]
    """path -> the paths of its children not left out by ``ignore_modules``."""
    first_run: dict[str, int]
    """path -> index of the first node run in the module or under it; absent: it did not run."""
    uncounted: frozenset[tuple[str, str]]
    """(path, op) of the ops that ran uncounted in that module itself."""
    latency: dict[str, float]
    """path -> inclusive seconds, when measured."""
    magnitude: Callable[[Any], float]
    """A count's value for ranking (see `format.magnitude`)."""

    @classmethod
    def of(cls, report: Report, ignore_types: Collection[str] = ()) -> ModuleTree:
        first_run = _first_runs(report)
        children: dict[str, list[str]] = defaultdict(list)
        for m in report.modules:
            if m.path and not _ignored(m, ignore_types):
                children[parent(m.path)].append(m.path)
        never_ran = len(report.nodes)
        for paths in children.values():
            paths.sort(key=lambda p: (first_run.get(p, never_ran), _natural(p)))
        latency = ({t.path: t.inclusive_s for t in report.runtime.modules}
                   if report.runtime is not None else {})
        return cls(records={m.path: m for m in report.modules}, children=children,
                   first_run=first_run,
                   uncounted=frozenset((path, u.op) for u in report.uncounted
                                       for path in u.modules),
                   latency=latency, magnitude=magnitude(report))

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


def _first_runs(report: Report) -> dict[str, int]:
    """path -> index of the first node run in the module or under it: an order, no cost."""
    first_run: dict[str, int] = {}
    for index, node in enumerate(report.nodes):
        path = node.module
        while path not in first_run:  # every enclosing module first ran here or earlier
            first_run[path] = index
            if not path:
                break
            path = parent(path)
    return first_run


# --- module tree -------------------------------------------------------------------------------

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
    tree = ModuleTree.of(report, ignore_modules)
    measured = report.runtime is not None
    root_latency = tree.latency.get("")
    headers = ["module", "params", "% params", "MACs", "% MACs", "FLOPs", "% FLOPs"]
    align = "lrrrrrr"
    train = report.mode == "train"
    if train:
        headers += ["backward FLOPs", "bwd / fwd"]
        align += "rr"
    if measured:
        headers += ["latency", "% latency", "FLOP/s"]
        align += "rrr"
    headers.append("functionals")
    align += "l"
    if extra_reprs is not None:
        headers.append("extra repr")
        align += "l"

    rows = []

    def emit(group: _Group, level: int) -> None:
        records = [tree.records[p] for p in group.paths]
        inclusive = sum((m.inclusive for m in records), Cost())
        params = sum(m.params for m in records)
        row = [style.indent * level + group.label,
               style.count(params), style.percent(params, report.params),
               style.count(inclusive.macs, "MACs"),
               style.percent(inclusive.macs, report.total.macs),
               style.count(inclusive.flops), style.percent(inclusive.flops, report.total.flops)]
        if train:
            backward = sum((m.backward for m in records), Cost())
            row += [style.count(backward.flops),
                    style.ratio(backward.flops, inclusive.flops - backward.flops)]
        if measured:
            seconds = [tree.latency[p] for p in group.paths if p in tree.latency]
            latency = sum(seconds) if seconds else None
            row += [style.seconds(latency),
                    None if latency is None or root_latency is None
                    else style.percent(latency, root_latency),
                    style.count(inclusive.flops / latency, "FLOP/s") if latency else None]
        row.append(_functionals(tree, group.paths, style))
        if extra_reprs is not None:
            row.append(extra_reprs.get(group.paths[0], ""))
        rows.append(row)
        if depth >= 0 and level >= depth:
            return
        for child in _child_groups(tree, group, collapse):
            emit(child, level + 1)

    emit(_Group(("",), root_label(report, tree.records[""])), 0)
    return style.titled(
        "Module tree: inclusive counts (a row includes the rows under it); functionals: the ops "
        "a module runs itself, outside its children",
        style.table(rows, headers, align))


def _child_groups(tree: ModuleTree, group: _Group, collapse: bool) -> list[_Group]:
    """The rows under ``group``: its first instance's children, each summed over the instances,
    with runs of identical numbered siblings merged when ``collapse``."""
    first = group.paths[0]
    names = [child[len(first) + 1 if first else 0:] for child in tree.children.get(first, [])]
    runs: list[list[str]] = []
    for name in names:
        run = runs[-1] if runs else None
        if (collapse and run and name.isdigit() and run[-1].isdigit()
                and int(name) == int(run[-1]) + 1
                and tree.signature(join(first, name)) == tree.signature(join(first, run[0]))):
            run.append(name)
        else:
            runs.append([name])
    groups = []
    for run in runs:
        paths = tuple(join(base, name) for name in run for base in group.paths)
        record = tree.records[paths[0]]
        type_name = short_name(record.type)
        if len(run) > 1:
            label = f"({run[0]})..({run[-1]}): {type_name} x {len(run)}"
        else:
            label = f"({run[0]}): {type_name}" if type_name else f"({run[0]})"
            label += _calls_note(record, ran=paths[0] in tree.first_run)
        groups.append(_Group(paths, label))
    return groups


def _functionals(tree: ModuleTree, paths: Sequence[str], style: Style) -> str:
    """``add.Tensor x2: 1.57 M``: the ops with FLOPs (or uncounted) the modules run themselves,
    from their ``exclusive_operators``.

    A leaf module that runs a single op (a Linear) shows none: its row is that op already."""
    calls: dict[str, int] = defaultdict(int)
    flops: dict[str, Any] = defaultdict(int)
    for path in paths:
        for op, stats in tree.records[path].exclusive_operators.items():
            calls[op] += stats.calls
            flops[op] += stats.cost.flops
    uncounted = {op for op in calls if any((path, op) in tree.uncounted for path in paths)}
    shown = sorted((op for op in calls if flops[op] or op in uncounted),
                   key=lambda op: -tree.magnitude(flops[op]))
    if len(shown) == 1 and not tree.children.get(paths[0]) and shown[0] not in uncounted:
        return ""
    parts = []
    for op in shown:
        times = f" x{calls[op]}" if calls[op] > 1 else ""
        value = "uncounted" if op in uncounted else style.count(flops[op])
        parts.append(f"{_short_op(op)}{times}: {value}")
    return ", ".join(parts)


def root_label(report: Report, root: ModuleRecord) -> str:
    return short_name(root.type) or report.model


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
    tree = ModuleTree.of(report, ignore_modules)
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
    for m in _visible(tree):
        if depth < 0 or m.depth <= depth:
            key = (short_name(m.type) or "?") if group_by == "type" else (m.path or report.model)
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


def _visible(tree: ModuleTree) -> list[ModuleRecord]:
    """The root and every module not left out by ``ignore_modules`` (nor under one)."""
    out, stack = [], [""]
    while stack:
        path = stack.pop()
        out.append(tree.records[path])
        stack.extend(tree.children.get(path, []))
    return out


# --- names -------------------------------------------------------------------------------------

def _ignored(record: ModuleRecord, ignore_types: Collection[str]) -> bool:
    return bool(ignore_types) and (record.type in ignore_types
                                   or short_name(record.type) in ignore_types)


def _natural(path: str) -> list:
    """Sort key: ``h.2`` before ``h.10``."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split(".")]




def _short_op(op: str) -> str:
    """``aten.add.Tensor`` -> ``add.Tensor``; ``aten.linear.default`` -> ``linear``."""
    return op.removeprefix("aten.").removesuffix(".default")
