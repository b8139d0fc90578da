"""What one analysis run prints in each format the command writes (``table``, ``json``,
``csv``, ``md``, ``html``): `Results` holds the values the analyses returned (a FLOPs report
with its sweep, budget comparison or roofline beside it, or a record with a text view of its
own: a step's memory, a fit plan, a split's ranks, a packed row's step, the conventions), and
`to_format` writes them with the renderers of `render` (and `budgets.comparison_table`, which
is why this sits above both, not in `render`). Pure: values in, text out; imports no torch.

From Python, the same text as ``exportflops gpt2 --device-model h100-sxm --format md``::

    results = Results(report, roofline=roofline(report, "h100-sxm"))
    text = to_format(results, "md")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .budgets.table import comparison_table
from .errors import InputError
from .records import Report
from .records.context import ContextParallelReport
from .records.conventions import Conventions
from .records.experts import ExpertParallelReport
from .records.fit import FitPlan
from .records.memory import MemoryOnDevice, MemoryReport
from .records.pipeline import PipelineReport
from .render import RenderOptions, flops_report, to_markdown
from .render.context import context_view
from .render.conventions import conventions_view
from .render.experts import experts_view
from .render.fit import fit_plan_view
from .render.format import MARKDOWN, Style
from .render.memory import memory_view
from .render.pipeline import pipeline_view
from .render.roofline import roofline_view
from .render.tables import sweep_view, to_csv

FORMATS = ("table", "json", "csv", "md", "html")

#: The text view of each record an analysis prints as it is, as a function of (record, style,
#: the `RenderOptions`, `Results.rank`): the memory tree to ``depth``, the experts' collectives
#: timed at ``link_bytes_per_s``.
RECORD_VIEWS: dict[type, Callable[[Any, Style, RenderOptions, int | None], str]] = {
    MemoryReport: lambda record, style, o, rank: memory_view(record, style, o.depth) + "\n",
    MemoryOnDevice: lambda record, style, o, rank: memory_view(record, style, o.depth) + "\n",
    FitPlan: lambda record, style, o, rank: fit_plan_view(record, style) + "\n",
    PipelineReport: lambda record, style, o, rank: pipeline_view(record, style, rank=rank),
    ExpertParallelReport: lambda record, style, o, rank: experts_view(
        record, rank=rank or 0, style=style, link_bytes_per_s=o.link_bytes_per_s),
    ContextParallelReport: lambda record, style, o, rank: context_view(record, style=style,
                                                                       rank=rank or 0),
    Conventions: lambda record, style, o, rank: conventions_view(record, style=style),
}


@dataclass(frozen=True)
class Results:
    """The values one run of the analyses returned, as `to_format` writes them."""

    report: Any = None
    """The FLOPs `Report` (or `GenerationReport`); None where ``record`` is what is printed."""
    extra_reprs: dict[str, str] | None = None
    """Module path -> its ``extra_repr()``, the tree view's last column
    (`exportflops.attribution.extra_reprs`)."""
    sweep: list[Report] | None = None
    """``report.sweep(**points)``: the report evaluated at each point."""
    points: dict[str, list[int]] | None = None
    """The values of each dynamic size the sweep took."""
    comparison: Any = None
    """A published budget's `Comparison` with the report (`exportflops.budgets.compare`)."""
    roofline: Any = None
    """The report's `Roofline` on a device."""
    roofs: tuple[dict[str, float], float] | None = None
    """The HTML scatter's roofs: (label -> peak FLOP/s, memory bandwidth in bytes/s), as
    `exportflops.roofline.predict.device_roofs` gives them."""
    record: Any = None
    """An analysis with a record of its own (`MemoryReport`, `FitPlan`, `PipelineReport`,
    ...): the record JSON writes and its view in `RECORD_VIEWS` draws."""
    rank: int | None = None
    """The rank a per-rank record's view marks (a `PipelineReport`'s pipeline rank) or whose
    traffic it lists (an expert or context-parallel rank; None: rank 0)."""
    view: Callable[..., str] | None = None
    """``view(record, style=...)``: the record's text, as a table or (`MARKDOWN`) Markdown, for
    a record `RECORD_VIEWS` has no view of (or in place of its)."""


def to_format(results: Results, format: str = "table",
              options: RenderOptions = RenderOptions()) -> str:
    """``results`` as ``format``, one of `FORMATS`: ``options`` are the FLOPs views' (their
    ``extra_reprs`` are ``results.extra_reprs``; ``format="csv"`` writes one row per op where
    ``options.view`` is ``("operators",)``, else one per module)."""
    if format not in FORMATS:
        raise InputError(f"to_format(format={format!r}): the formats are "
                         f"{', '.join(FORMATS)}.")
    if results.record is not None:
        return _record(results, format, options)
    if format == "json":
        return _json(results)
    if format == "html":
        from .render.html import html_report

        peaks, bandwidth = results.roofs or (None, None)
        return html_report(results.report, roofline=results.roofline, peaks=peaks,
                           bandwidth_byte_per_s=bandwidth)
    if results.sweep is not None:
        tablefmt = {"md": "github", "csv": "csv"}.get(format, "simple")
        return sweep_view(results.sweep, results.points or {}, tablefmt) + "\n"
    if format == "csv":
        return to_csv(results.report,
                      rows="operators" if options.view == ("operators",) else "modules")
    style = MARKDOWN if format == "md" else Style()
    text = (to_markdown if format == "md" else flops_report)(results.report, options,
                                                             extra_reprs=results.extra_reprs)
    if results.comparison is not None:
        text += "\n" + comparison_table(results.comparison, tablefmt=style.tablefmt) + "\n"
    if results.roofline is not None:
        text += "\n" + roofline_view(results.roofline, style, depth=options.depth,
                                     top=options.top)
    return text


def _record(results: Results, format: str, options: RenderOptions) -> str:
    """An analysis's own record: its JSON, its page, or its view."""
    record = results.record
    if format == "json":
        return record.model_dump_json(indent=2) + "\n"
    view = results.view or _view_of(record, options, results.rank)
    if format == "html" and isinstance(record, (MemoryReport, MemoryOnDevice)):
        from .render.memory_html import memory_page

        return memory_page(record)
    if format == "html":  # a split's ranks: a bar per rank (and a pipeline's timeline)
        from .render.html import parallel_page

        return parallel_page(record, view=view)
    return view(record, style=MARKDOWN if format == "md" else Style())


def _view_of(record: Any, options: RenderOptions, rank: int | None) -> Callable[..., str]:
    """``record``'s view in `RECORD_VIEWS`, called as ``view(record, style=...)``."""
    drawn = RECORD_VIEWS.get(type(record))
    if drawn is None:
        raise InputError(f"Results(record=...) holds a {type(record).__name__}, which has no "
                         f"view: pass Results(view=...) to draw it, or a record of "
                         f"{', '.join(kind.__name__ for kind in RECORD_VIEWS)}.")
    return lambda record, style: drawn(record, style, options, rank)


def _json(results: Results) -> str:
    """The report; with its roofline and its comparison, all in one object; a sweep's reports
    in a list."""
    def dumped(record: Any) -> Any:
        return record.model_dump(mode="json")

    if results.sweep is not None:
        return json.dumps([dumped(report) for report in results.sweep], indent=2) + "\n"
    beside = {name: dumped(value) for name, value in (("roofline", results.roofline),
                                                       ("comparison", results.comparison))
              if value is not None}
    if not beside:
        return results.report.model_dump_json(indent=2) + "\n"
    return json.dumps({"report": dumped(results.report), **beside}, indent=2) + "\n"
