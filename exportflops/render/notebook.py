"""Reports -> the HTML a notebook shows for them (the records' ``_repr_html_``): the summary
tables and the module tree as nested ``<details>``, collapsible by a click.

Pure functions of one record, like every renderer, with the text views' numbers: each table is
a text view (`summary_view`, `generation_view`, `roofline_view`, `collectives_view`,
`operators_view`, and the per-rank views `pipeline_view`, `experts_view`, `context_view`) drawn
by tabulate as HTML, so a count is written as the text prints it
(``8.24 G``, ``4.09 GMACs``, a count of dynamic sizes as its expression). No script, no
stylesheet or font from the network, no optional package: the HTML works wherever a notebook
renders HTML (Jupyter, VS Code, GitHub's viewer, which drops scripts).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from ..records.names import parent, short_name
from ..records import GenerationReport, Report, Roofline
from ..records.context import ContextParallelReport
from ..records.experts import ExpertParallelReport
from ..records.pipeline import PipelineReport
from .collectives import collectives_view
from .context import context_view
from .experts import experts_view
from .format import Style
from .generation import generation_view
from .pipeline import pipeline_view
from .roofline import roofline_view
from .tables import operators_view, summary_view
from .tree import ModuleTree, root_label

#: Scoped to the report's own ``<div>``, so a notebook's other cells keep their look.
_CSS = """
.exportflops { font-family: system-ui, sans-serif; font-size: 0.9em; }
.exportflops table { border-collapse: collapse; margin: 0.3em 0 0.8em 0; }
.exportflops th, .exportflops td { border: 1px solid #ddd; padding: 1px 6px; }
/* a number stays on one line; tabulate right-aligns the number columns */
.exportflops td[style*=right], .exportflops th[style*=right] { white-space: nowrap; }
.exportflops details { margin-left: 1.2em; }
.exportflops details > summary { cursor: pointer; }
.exportflops .leaf { margin-left: 2.4em; }
.exportflops .type { color: #666; }
.exportflops h4 { margin: 0.6em 0 0.2em 0; }
"""


class HtmlStyle(Style):
    """The text views' style with tables drawn as HTML (tabulate escapes each cell) and each
    view's title as a heading."""

    def titled(self, title: str, body: str) -> str:
        return f"<h4>{html.escape(title)}</h4>\n{body}"


HTML = HtmlStyle(tablefmt="html")


def report_html(report: Report) -> str:
    """A `Report`: its summary, its module tree (inclusive counts, the root open), its
    collectives when it is one rank of a parallelized model, and its operators (closed)."""
    return _wrapped(_report_body(report))


def generation_html(report: GenerationReport) -> str:
    """A `GenerationReport`: the per-token table, then the prefill's and the decode step's
    reports, each closed (the decode step's counts are polynomials in ``past``)."""
    sections = [generation_view(report, HTML)]
    sections.append(_closed("The prefill: the forward over the prompts",
                            _report_body(report.prefill)))
    sections.append(_closed("One decode step (counts in past, the tokens already cached)",
                            _report_body(report.decode)))
    if report.decode_windowed is not None:
        sections.append(_closed("One decode step once the sliding windows are full",
                                _report_body(report.decode_windowed)))
    return _wrapped("\n".join(sections))


def roofline_html(roofline: Roofline) -> str:
    """A `Roofline`: the roofs, the modules down to depth 1 and the ten slowest nodes (the text
    view's tables), then every module as a tree with its predicted time and bound."""
    paths = [m.path for m in roofline.modules]
    by_path = {m.path: m for m in roofline.modules}
    by_path.setdefault("", roofline.total)

    def label(path: str) -> str:
        m = by_path[path]
        name = short_name(path) or short_name(roofline.model) or roofline.model
        return (f"<b>{html.escape(name)}</b> &middot; predicted "
                f"{html.escape(str(HTML.seconds(m.predicted_s)))} ({m.bound}-bound) &middot; "
                f"FLOPs {html.escape(str(HTML.count(m.flops)))} &middot; "
                f"bytes {html.escape(str(HTML.count(m.bytes, 'B')))}")

    children = _children([p for p in paths if p])
    tree = _tree("", children, label)
    return _wrapped(roofline_view(roofline, HTML, depth=1, top=10)
                    + "<h4>Module tree: predicted time of each module's nodes</h4>\n" + tree)


#: Each per-rank record's text view, as a function of (record, style, rank): ``rank`` marks
#: that rank's rows (pipeline) or lists its traffic (experts, context: rank 0 when None).
PARALLEL_VIEWS: dict[type, Callable[[Any, Style, int | None], str]] = {
    PipelineReport: lambda record, style, rank: pipeline_view(record, style, rank=rank),
    ExpertParallelReport: lambda record, style, rank: experts_view(record, rank=rank or 0,
                                                                    style=style),
    ContextParallelReport: lambda record, style, rank: context_view(record, style=style,
                                                                     rank=rank or 0),
}


def parallel_html(record: PipelineReport | ExpertParallelReport | ContextParallelReport, *,
                  rank: int | None = None, view: Callable[..., str] | None = None) -> str:
    """A `PipelineReport`, `ExpertParallelReport` or `ContextParallelReport`: its ranks side by
    side and the rank that sets the step, its text view's tables as HTML and its sentences as
    paragraphs. ``view``: a view called as ``view(record, style=...)`` (the command's, with its
    flags) instead of the record kind's with ``rank``."""
    if view is None:
        drawn = PARALLEL_VIEWS.get(type(record))
        if drawn is None:
            raise TypeError(f"no per-rank view for a {type(record).__name__}: the per-rank "
                            f"records are {', '.join(t.__name__ for t in PARALLEL_VIEWS)}")
        text = drawn(record, HTML, rank)
    else:
        text = view(record, style=HTML)
    # The views join tables (every line of tabulate's HTML starts with a tag) and plain
    # sentences: each sentence becomes an escaped paragraph.
    return _wrapped("\n".join(line if line.startswith("<") else f"<p>{html.escape(line)}</p>"
                              for line in text.splitlines() if line.strip()))


# --- the pieces ---------------------------------------------------------------------------------

def _wrapped(body: str) -> str:
    return f"<div class='exportflops'>\n<style>{_CSS}</style>\n{body}\n</div>"


def _closed(title: str, body: str) -> str:
    return f"<details><summary><b>{html.escape(title)}</b></summary>\n{body}\n</details>"


def _report_body(report: Report) -> str:
    sections = [summary_view(report, HTML),
                "<h4>Module tree: inclusive counts, a click opens a module</h4>",
                _module_tree(report)]
    if report.collectives or report.world_size > 1:
        sections.append(collectives_view(report, HTML))
    sections.append(_closed("Operators", operators_view(report, HTML)))
    return "\n".join(sections)


def _module_tree(report: Report) -> str:
    tree = ModuleTree.of(report)
    total = report.total
    timed = tree.latency

    def label(path: str) -> str:
        m = tree.records[path]
        name = short_name(path) if path else root_label(report, m)
        parts = [f"FLOPs {HTML.count(m.inclusive.flops)} "
                 f"({HTML.percent(m.inclusive.flops, total.flops)})",
                 f"{HTML.count(m.inclusive.macs, 'MACs')}",
                 f"params {HTML.count(m.params)}"]
        if report.mode == "train":
            parts.append(f"backward FLOPs {HTML.count(m.backward.flops)}")
        if path in timed:
            parts.append(f"latency {HTML.seconds(timed[path])}")
        kind = short_name(m.type)
        return (f"<b>{html.escape(name)}</b>"
                + (f" <span class='type'>{html.escape(kind)}</span>" if kind and path else "")
                + " &middot; " + " &middot; ".join(html.escape(str(p)) for p in parts))

    return _tree("", tree.children, label)


def _children(paths: list[str]) -> dict[str, list[str]]:
    """path -> its children among ``paths`` (parents before children); a module whose parent
    is not listed hangs under its nearest listed ancestor."""
    listed, children = set(paths) | {""}, {}
    for path in paths:
        above = parent(path)
        while above not in listed:
            above = parent(above)
        children.setdefault(above, []).append(path)
    return children


def _tree(path: str, children: dict[str, list[str]], label: Callable[[str], str]) -> str:
    """``path`` and everything under it: a module with children is a ``<details>`` (the root
    open), a leaf a plain line."""
    below = children.get(path, [])
    if not below:
        return f"<div class='leaf'>{label(path)}</div>"
    inner = "\n".join(_tree(child, children, label) for child in below)
    opened = " open" if not path else ""
    return f"<details{opened}><summary>{label(path)}</summary>\n{inner}\n</details>"


__all__ = ["HTML", "generation_html", "parallel_html", "report_html", "roofline_html"]
