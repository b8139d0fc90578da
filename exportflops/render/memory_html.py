"""MemoryReport -> one self-contained HTML page (`memory_page`): the summary, the bytes of each
kind at the peak, the module table, and the step's timeline as a picture (`memory_timeline`:
the live bytes after every op, stacked by kind, the phases shaded, so the saw-tooth of a
training step shows: activations climbing through the forward and falling through the
backward as gradients arrive). The page is `html.py`'s: offline, no request leaves it.
Imports no torch."""

from __future__ import annotations

import html
from typing import Any

from ..records.memory import DeviceFit, KindBytes, MemoryOnDevice, MemoryReport
from ..records.names import short_name
from .format import Style
from .html import _page, _plots, _table
from .memory import fit_view, memory_view
from .palette import PALETTE
from .plots import plotly

_STYLE = Style()

#: The color each kind is drawn in, on the page and in the notebooks.
KIND_COLORS: dict[str, str] = dict(zip(KindBytes.model_fields, PALETTE))
#: The shade of each phase behind the timeline (the forward's is the page's background).
_PHASE_SHADES = {"backward": "rgba(171, 99, 250, 0.08)", "optimizer": "rgba(255, 161, 90, 0.12)"}


def memory_page(report: MemoryReport | MemoryOnDevice, fit: DeviceFit | None = None) -> str:
    """The whole page: ``#summary`` (the text view's title and kinds; with ``fit``, whether
    the peak fits its device), ``#memory-timeline`` (the picture), ``#kinds`` and
    ``#memory-modules`` (sortable tables). A `MemoryOnDevice` is its memory with its fit."""
    if isinstance(report, MemoryOnDevice):
        report, fit = report.memory, report.fit
    summary = memory_view(report, _STYLE, max_depth=0)
    if fit is not None:
        summary += "\n\n" + fit_view(fit, _STYLE)
    return _page(f"exportflops memory: {report.model}", [
        f"<pre id='summary'>{html.escape(summary)}</pre>",
        _plots([("memory-timeline", memory_timeline(report))]),
        "<h2>By kind</h2>", _kinds_table(report),
        "<h2>Modules</h2>", _modules_table(report),
    ])


def memory_timeline(report: MemoryReport) -> Any:
    """The live bytes after every op, one stacked area per kind (their top is the total), the
    backward and optimizer phases shaded, the peak marked."""
    go = plotly()
    points = report.timeline
    index = [point.index for point in points]
    hover = [f"{point.op} in {point.module or '(root)'} ({point.phase})" for point in points]
    figure = go.Figure()
    for kind, color in KIND_COLORS.items():
        figure.add_trace(go.Scatter(
            x=index, y=[getattr(point.live, kind) for point in points], name=kind,
            stackgroup="live", mode="lines", line={"width": 0.5, "color": color},
            customdata=hover, hovertemplate=f"{kind}: %{{y:.4s}}B<br>%{{customdata}}"
                                            f"<extra></extra>"))
    for phase, (first, last) in _phase_spans(report).items():
        if phase in _PHASE_SHADES:
            figure.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=_PHASE_SHADES[phase],
                             line_width=0, annotation_text=phase,
                             annotation_position="top left")
    peak_at = int(report.peak_node.rsplit("#", 1)[1])
    figure.add_annotation(x=peak_at, y=report.peak_bytes, text="peak", showarrow=True,
                          arrowhead=2)
    figure.update_layout(
        title={"text": f"Live bytes over the step ({_STYLE.count(report.peak_bytes, 'B')} "
                       f"at the peak)", "font": {"size": 13}},
        xaxis={"title": "op of the step"}, yaxis={"title": "bytes", "tickformat": ".3s"},
        height=420, margin={"t": 50, "l": 10, "r": 10, "b": 10}, hovermode="x unified")
    return figure


def _phase_spans(report: MemoryReport) -> dict[str, tuple[int, int]]:
    """Each phase's first and last op (the phases run one after the other)."""
    spans: dict[str, tuple[int, int]] = {}
    for point in report.timeline:
        first, _ = spans.get(point.phase, (point.index, point.index))
        spans[point.phase] = (first, point.index)
    return spans


def _bytes(value: int) -> tuple[str, int]:
    return str(_STYLE.count(value, "B")), value


def _kinds_table(report: MemoryReport) -> str:
    rows = [[kind, _bytes(getattr(report.by_kind, kind)),
             (_STYLE.percent(getattr(report.by_kind, kind), report.peak_bytes),
              getattr(report.by_kind, kind)),
             _bytes(getattr(report.max_by_kind, kind))] for kind in KindBytes.model_fields]
    return _table("kinds", ["kind", "at the peak", "share", "own maximum"], rows)


def _modules_table(report: MemoryReport) -> str:
    rows = [[module.path or "(root)", short_name(module.type), _bytes(module.activations),
             _bytes(module.own_activations), _bytes(module.largest_temporary),
             module.largest_temporary_op or "-"] for module in report.modules]
    return _table("memory-modules", ["module", "type", "activations saved", "own",
                                     "largest temporary", "made by"], rows)
