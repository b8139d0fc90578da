"""Report -> one self-contained HTML page: the summary, the module tree as an icicle (by FLOPs,
and by measured time when the report was profiled), a roofline-style scatter of the nodes, and
the module, node and operator tables, sortable by a click on a column's heading.

The page opens offline: plotly's JavaScript is written into it (``include_plotlyjs`` inline,
about 5 MB), and a Content-Security-Policy forbids every request (``default-src 'none'``), so
nothing is fetched when it is opened. Like every renderer this is a pure function of the report
(and of the optional roofline and roofs); `write_html` writes the file.

`parallel_page` is the same kind of page for a per-rank record (`PipelineReport`,
`ExpertParallelReport`, `ContextParallelReport`): a bar per rank, the pipeline's timeline, and
the record's tables.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from ..records.names import short_name
from ..records import Report
from ..records.context import ContextParallelReport
from ..records.experts import ExpertParallelReport
from ..records.pipeline import PipelineReport
from .format import Style, magnitude
from .notebook import parallel_html
from .plots import (RooflineLike, intensity, module_icicle, pipeline_timeline, plotly,
                    rank_flops_bars, roofline_scatter)
from .tables import require_report, summary_view

#: No request may leave the page: scripts and styles are inline, images data: URLs.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; "
                           "style-src 'unsafe-inline'; img-src data:; font-src data:")

_STYLE = Style()

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; }
table.sortable { border-collapse: collapse; font-size: 0.85em; margin-bottom: 2em; }
table.sortable th { cursor: pointer; background: #eee; position: sticky; top: 0; }
table.sortable th, table.sortable td { border: 1px solid #ddd; padding: 2px 6px; }
table.sortable td.n { text-align: right; font-variant-numeric: tabular-nums; }
th[data-dir=asc]::after { content: " \\25B2"; } th[data-dir=desc]::after { content: " \\25BC"; }
"""

# Sorts a table by the clicked column: by each cell's data-v (the raw number) when it has one,
# else by its text; a second click reverses the order.
_SORT_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], column = th.cellIndex;
    var dir = th.dataset.dir === "desc" ? "asc" : "desc";
    table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = dir;
    function key(row) {
      var cell = row.cells[column];
      return cell.dataset.v !== undefined ? parseFloat(cell.dataset.v) : cell.textContent;
    }
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b), order = x < y ? -1 : x > y ? 1 : 0;
      return dir === "asc" ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""


def html_report(report: Report, *, roofline: RooflineLike | None = None,
                peaks: dict[str, float] | None = None,
                bandwidth_byte_per_s: float | None = None) -> str:
    """The whole page. ``roofline`` (``exportflops.roofline.roofline(report, device)``) adds
    each node's predicted rate to the scatter and its predicted time and bound to the node
    table; ``peaks`` (label -> FLOP/s) and ``bandwidth_byte_per_s`` are the roofs drawn. A
    measured report's own peak (``runtime.peak_flop_per_s``) is drawn when no peak is given."""
    require_report(report, "html_report")
    runtime = report.runtime
    if not peaks and runtime is not None and runtime.peak_flop_per_s:
        peaks = {f"peak {_STYLE.count(runtime.peak_flop_per_s)}FLOP/s "
                 f"({runtime.peak_source[:60]})": runtime.peak_flop_per_s}
    figures = [("icicle-flops", module_icicle(report))]
    if runtime is not None:
        figures.append(("icicle-time", module_icicle(report, by="time")))
    figures.append(("roofline", roofline_scatter(report, roofline=roofline, peaks=peaks,
                                                 bandwidth_byte_per_s=bandwidth_byte_per_s)))
    title = f"exportflops report: {report.model}"
    return _page(title, [
        f"<pre id='summary'>{html.escape(summary_view(report, _STYLE))}</pre>",
        _plots(figures),
        "<h2>Modules</h2>", _modules_table(report),
        "<h2>Nodes</h2>", _nodes_table(report, roofline),
        "<h2>Operators</h2>", _operators_table(report),
    ])


def parallel_page(record: PipelineReport | ExpertParallelReport | ContextParallelReport, *,
                  rank: int | None = None, view: Callable[..., str] | None = None) -> str:
    """A per-rank record's page: one bar per rank as high as its FLOPs over the step, the rank
    that sets the step hatched (``#rank-flops``); for a pipeline the step's timeline, one row
    per rank and one bar per action (``#timeline``); then the record's tables. ``rank`` is the
    rank the tables mark or whose traffic they list; ``view`` a text view called as
    ``view(record, style=...)`` instead (the command passes its own)."""
    figures = [("rank-flops", rank_flops_bars(record))]
    if isinstance(record, PipelineReport):
        figures.append(("timeline", pipeline_timeline(record)))
    return _page(f"exportflops: {record.model} per rank", [
        _plots(figures),
        parallel_html(record, rank=rank, view=view),
    ])


def _plots(figures: list[tuple[str, Any]]) -> str:
    """Each figure as a ``<div>`` of that id, drawn by the page's one copy of plotly.js."""
    pio = plotly("plotly.io")
    config = {"displaylogo": False, "responsive": True}
    return "\n".join(pio.to_html(figure, full_html=False, include_plotlyjs=False,
                                 div_id=div_id, config=config)
                     for div_id, figure in figures)


def _page(title: str, sections: list[str]) -> str:
    """The page around ``sections``: the policy, plotly.js inline, the sorting script."""
    plotly_js = plotly("plotly.offline").get_plotlyjs()
    title = html.escape(title)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CONTENT_SECURITY_POLICY}\">\n"
            f"<title>{title}</title>\n<style>{_CSS}</style>\n"
            f"<script>{plotly_js}</script>\n</head><body>\n<h1>{title}</h1>\n"
            + "\n".join(sections) + f"\n<script>{_SORT_SCRIPT}</script>\n</body></html>\n")


# --- the tables ---------------------------------------------------------------------------------

def _table(table_id: str, headers: list[str], rows: list[list[Any]]) -> str:
    """A sortable table; a cell is text, or (shown text, sort value) for a number."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return (f"<table class='sortable' id='{table_id}'><thead><tr>{head}</tr></thead>"
            f"<tbody>\n{body}\n</tbody></table>")


def _cell(cell: Any) -> str:
    if isinstance(cell, tuple):
        shown, value = cell
        sort = "" if value is None else f" data-v='{float(value)!r}'"
        return f"<td class='n'{sort}>{html.escape(str(shown if shown is not None else '-'))}</td>"
    return f"<td>{html.escape(str(cell))}</td>"


def _number(report: Report, count: Any, unit: str = "") -> tuple[str, float]:
    return str(_STYLE.count(count, unit)), magnitude(report)(count)


def _ratio(value: float | None) -> tuple[str, float | None]:
    return ("-" if value is None else f"{value:.3g}"), value


def _seconds(value: float | None) -> tuple[Any, float | None]:
    return _STYLE.seconds(value), value


def _modules_table(report: Report) -> str:
    headers = ["module", "type", "calls", "params", "FLOPs", "MACs", "bytes read",
               "bytes written", "FLOP/byte"]
    timed = {} if report.runtime is None else {m.path: m for m in report.runtime.modules}
    if timed:
        headers += ["latency (incl.)", "latency (own)", "achieved FLOP/s"]
    rows = []
    for m in report.modules:
        c = m.inclusive
        row = [m.path or "(root)", short_name(m.type), (m.calls, m.calls),
               _number(report, m.params), _number(report, c.flops), _number(report, c.macs),
               _number(report, c.bytes_read, "B"), _number(report, c.bytes_written, "B"),
               _ratio(intensity(report, c))]
        if timed:
            t = timed.get(m.path)
            row += [_seconds(t and t.inclusive_s), _seconds(t and t.exclusive_s),
                    _ratio(t and t.achieved_flop_per_s)]
        rows.append(row)
    return _table("modules", headers, rows)


def _nodes_table(report: Report, roofline: RooflineLike | None) -> str:
    headers = ["node", "op", "module", "status", "FLOPs", "MACs", "bytes read",
               "bytes written", "FLOP/byte"]
    timed = {} if report.runtime is None else {n.name: n for n in report.runtime.nodes}
    predicted = {} if roofline is None else {n.name: n for n in roofline.nodes}
    if timed:
        headers += ["median latency", "achieved FLOP/s"]
    if predicted:
        headers += ["predicted time", "bound"]
    rows = []
    for n in report.nodes:
        c = n.cost
        row = [n.name, n.op, n.module or "(root)", n.status, _number(report, c.flops),
               _number(report, c.macs), _number(report, c.bytes_read, "B"),
               _number(report, c.bytes_written, "B"), _ratio(intensity(report, c))]
        if timed:
            t = timed.get(n.name)
            row += [_seconds(t and t.latency.median_s), _ratio(t and t.achieved_flop_per_s)]
        if predicted:
            p = predicted.get(n.name)
            row += [_seconds(p and p.predicted_s), p.bound if p else "-"]
        rows.append(row)
    return _table("nodes", headers, rows)


def _operators_table(report: Report) -> str:
    headers = ["op", "calls", "FLOPs", "MACs", "bytes read", "bytes written", "FLOP/byte"]
    rows = [[op, (s.calls, s.calls), _number(report, s.cost.flops),
             _number(report, s.cost.macs), _number(report, s.cost.bytes_read, "B"),
             _number(report, s.cost.bytes_written, "B"), _ratio(intensity(report, s.cost))]
            for op, s in report.operators.items()]
    return _table("operators", headers, rows)
