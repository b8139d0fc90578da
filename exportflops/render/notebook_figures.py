"""Records -> what a notebook cell shows for them (the records' ``_ipython_display_``): the HTML
of `notebook` (the record's ``_repr_html_``, with its text view as the plain-text fallback), then,
when plotly is installed (``pip install 'exportflops[html]'``), each of the record's pictures as
a display of its own:

- `Report`: the module tree as an icicle sized by FLOPs;
- `GenerationReport`: the prefill's module tree as that icicle;
- `Roofline`: each node at its predicted (and measured) FLOP/s under the device's roofs;
- `PipelineReport`, `ExpertParallelReport`, `ContextParallelReport`: a bar of FLOPs per rank,
  and for a pipeline the step's timeline.

A picture travels as data, never as a page: plotly's own MIME bundle
(``application/vnd.plotly.v1+json``: the figure's data and layout, and the config of plotly's
``plotly_mimetype`` renderer, exactly as that renderer writes it), which JupyterLab and Notebook 7
(through the extension plotly's package installs) and VS Code draw with their own plotly.js. So
no output carries plotly.js (3.5 MB a figure) and none loads it from a CDN (no request). Where
no plotly.js is at hand (GitHub's viewer, a terminal) the bundle's ``text/plain`` line says which
picture it is and how to open it as a page.

A picture's size grows with the model: an icicle box or a scatter point is 100 to 200 bytes of
JSON, so the icicle stops at the depth where it would pass `MAX_BOXES` modules and the scatter
keeps the `MAX_POINTS` slowest nodes, each saying so in its title and its text line (the HTML
page, ``exportflops.to_html``, draws them whole).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import MissingExtraError
from ..records import GenerationReport, Report, Roofline
from ..records.context import ContextParallelReport
from ..records.experts import ExpertParallelReport
from ..records.pipeline import PipelineReport
from .format import Style
from .generation import generation_view
from .notebook import PARALLEL_VIEWS
from .plots import (module_icicle, pipeline_timeline, plotly, rank_flops_bars,
                    roofline_record_scatter)
from .roofline import roofline_view
from .tables import summary_view

#: The most modules an icicle in a cell draws (up to about 200 KB of JSON); deeper ones are cut.
MAX_BOXES = 1000
#: The most nodes a roofline scatter in a cell draws: the slowest by predicted time.
MAX_POINTS = 1000

PLOTLY_MIME = "application/vnd.plotly.v1+json"

_TEXT = Style()


class Picture(NamedTuple):
    """One picture of a record, before plotly draws it."""

    draw: Callable[[], Any]
    """Builds the plotly figure (plotly imported by then); its title names it in ``text/plain``."""
    page: str
    """How to open it as a page, for the frontends that do not draw it."""


def bundles(record: Any) -> list[dict[str, Any]]:
    """The MIME bundles a cell shows for ``record``, in order: its HTML (and its text view as
    ``text/plain``), then each picture as plotly's own bundle when plotly imports; without
    plotly the HTML alone."""
    shown = SHOWN.get(type(record))
    if shown is None:
        raise TypeError(f"no notebook display for a {type(record).__name__}: the records shown "
                        f"are {', '.join(t.__name__ for t in SHOWN)}")
    text_view, pictures = shown
    found = [{"text/html": record._repr_html_(), "text/plain": text_view(record)}]
    try:
        renderer = plotly("plotly.io").renderers["plotly_mimetype"]
    except MissingExtraError:
        return found  # the pictures are the html extra's; the HTML needs no package
    for picture in pictures(record):
        # plotly's renderer adds its config to the dict it is given: a fresh one per figure
        figure = picture.draw()
        drawn = renderer.to_mimebundle(figure.to_dict())
        found.append({PLOTLY_MIME: drawn[PLOTLY_MIME],
                      "text/plain": f"[plotly figure] {figure.layout.title.text}; as a page: "
                                    f"{picture.page}"})
    return found


def show(record: Any) -> None:
    """Publishes `bundles` to IPython's display, one output each (``_ipython_display_``)."""
    from IPython.display import display

    for bundle in bundles(record):
        display(bundle, raw=True)


# --- each record kind's text view and pictures --------------------------------------------------

def _icicle(report: Report, name: str, what: str) -> Picture:
    """The module tree sized by FLOPs, cut at the depth where it would pass `MAX_BOXES`."""
    depth = _icicle_depth(report)
    deepest = max(m.depth for m in report.modules)
    cut = (f", down to depth {depth} of {deepest} "
           f"({sum(m.depth <= depth for m in report.modules)} of {len(report.modules)} modules)"
           if depth < deepest else "")

    def draw() -> Any:
        figure = module_icicle(report, max_depth=depth)
        return figure.update_layout(title=f"{what} of {report.model} by FLOPs{cut}")

    return Picture(draw, f"exportflops.render.plots.module_icicle({name}).show(), "
                         f"or exportflops.to_html({name})")


def _icicle_depth(report: Report) -> int:
    """The deepest level whose modules, with every one above, number at most `MAX_BOXES`."""
    per_depth: dict[int, int] = {}
    for m in report.modules:
        per_depth[m.depth] = per_depth.get(m.depth, 0) + 1
    depth, boxes = 0, per_depth.get(0, 0)
    while depth + 1 in per_depth and boxes + per_depth[depth + 1] <= MAX_BOXES:
        depth += 1
        boxes += per_depth[depth]
    return depth


def _report_pictures(report: Report) -> list[Picture]:
    return [_icicle(report, "report", "The modules")]


def _generation_pictures(report: GenerationReport) -> list[Picture]:
    return [_icicle(report.prefill, "generation.prefill", "The prefill's modules")]


def _roofline_pictures(roofline: Roofline) -> list[Picture]:
    return [Picture(lambda: roofline_record_scatter(roofline, top=MAX_POINTS),
                    "exportflops.render.plots.roofline_record_scatter(roofline).show()")]


def _rank_pictures(record: PipelineReport | ExpertParallelReport | ContextParallelReport,
                   ) -> list[Picture]:
    page = "exportflops.render.html.parallel_page(record), or --format html"
    pictures = [Picture(lambda: rank_flops_bars(record), page)]
    if isinstance(record, PipelineReport):
        pictures.append(Picture(lambda: pipeline_timeline(record), page))
    return pictures


def _rank_text(record: PipelineReport | ExpertParallelReport | ContextParallelReport) -> str:
    return PARALLEL_VIEWS[type(record)](record, _TEXT, None)


#: Each record kind a cell shows: its text view (the ``text/plain`` beside its HTML) and its
#: pictures.
SHOWN: dict[type, tuple[Callable[[Any], str], Callable[[Any], list[Picture]]]] = {
    Report: (lambda report: summary_view(report, _TEXT), _report_pictures),
    GenerationReport: (lambda report: generation_view(report, _TEXT), _generation_pictures),
    Roofline: (lambda roofline: roofline_view(roofline, _TEXT, depth=1, top=10),
               _roofline_pictures),
    PipelineReport: (_rank_text, _rank_pictures),
    ExpertParallelReport: (_rank_text, _rank_pictures),
    ContextParallelReport: (_rank_text, _rank_pictures),
}

__all__ = ["MAX_BOXES", "MAX_POINTS", "PLOTLY_MIME", "Picture", "bundles", "show"]
