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
from .records.memory import MemoryOnDevice, MemoryReport
from .render import RenderOptions, flops_report, to_markdown
from .render.format import MARKDOWN, Style
from .render.roofline import roofline_view
from .render.tables import sweep_view, to_csv

FORMATS = ("table", "json", "csv", "md", "html")


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
    ...): the record JSON writes and ``view`` draws."""
    view: Callable[..., str] | None = None
    """``view(record, style=...)``: the record's text, as a table or (`MARKDOWN`) Markdown."""


def to_format(results: Results, format: str = "table",
              options: RenderOptions = RenderOptions()) -> str:
    """``results`` as ``format``, one of `FORMATS`: ``options`` are the FLOPs views' (their
    ``extra_reprs`` are ``results.extra_reprs``; ``format="csv"`` writes one row per op where
    ``options.view`` is ``("operators",)``, else one per module)."""
    if format not in FORMATS:
        raise InputError(f"to_format(format={format!r}): the formats are "
                         f"{', '.join(FORMATS)}.")
    if results.record is not None:
        return _record(results, format)
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


def _record(results: Results, format: str) -> str:
    """An analysis's own record: its JSON, its page, or its view."""
    record = results.record
    if format == "json":
        return record.model_dump_json(indent=2) + "\n"
    if format == "html" and isinstance(record, (MemoryReport, MemoryOnDevice)):
        from .render.memory_html import memory_page

        return memory_page(record)
    if format == "html":  # a split's ranks: a bar per rank (and a pipeline's timeline)
        from .render.html import parallel_page

        return parallel_page(record, view=results.view)
    return results.view(record, style=MARKDOWN if format == "md" else Style())


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
