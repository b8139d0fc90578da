"""The pictures of the HTML report, as plotly figures: the module tree as an icicle, and a
roofline-style scatter of the nodes.

plotly is an optional extra (``pip install exportflops[html]``): it is imported when a figure is
drawn, and its absence is a `MissingExtraError` naming that step.

- `module_icicle`: one box per module, nested under its parent, as wide as the module's FLOPs
  (or its measured time) with its children's. Boxes are given the module's own work
  (``exclusive``) and plotly adds the children's (``branchvalues="remainder"``), so a box is
  exactly its inclusive count and no float sum can make a parent smaller than its children.
  A module with nothing to show (0 FLOPs, or never timed) has no area and is not drawn.
- `roofline_scatter`: one point per counted node that has FLOPs and bytes, at its arithmetic
  intensity (FLOPs per byte read and written); up the y axis its achieved FLOP/s when the report
  was measured, the rate of its predicted time when a roofline is given, else its FLOPs. The
  device's roofs, when known: the compute peak (a horizontal line) and the memory roof
  (bandwidth x intensity), meeting at the ridge point.
- `roofline_record_scatter`: the same picture from a `Roofline` record alone: each node at its
  predicted FLOP/s (on the roof, by construction) marked by its bound, its achieved FLOP/s when
  measured, under the roofs of the dtypes its nodes run at.
- `rank_flops_bars`: one bar per rank of a pipeline, expert- or context-parallel split, as high
  as the rank's FLOPs over the step; the rank whose time sets the step hatched and named.
- `pipeline_timeline`: one row per pipeline rank, one bar per action of the step from its start
  to its end (forward and backward in their colors, the microbatch written on it); idle time is
  the row's background between bars; the bubble fraction in the title.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from ..errors import optional_module
from ..records.names import parent, short_name
from ..records import Cost, NodeRecord, Report, Roofline
from ..records.context import ContextParallelReport
from ..records.experts import ExpertParallelReport
from ..records.pipeline import PipelineReport
from .format import Style, magnitude
from .palette import COLORS

_STYLE = Style()


class RooflineNode(Protocol):
    """What the scatter reads of a roofline's node (the `Roofline` record's nodes have it)."""

    name: str
    intensity: float
    bound: str
    predicted_s: float


class RooflineLike(Protocol):
    """A roofline of the report's nodes: ``exportflops.roofline.roofline(report, device)``."""

    nodes: Sequence[RooflineNode]


def plotly(module: str = "plotly.graph_objects") -> Any:
    """A module of plotly, or a `MissingExtraError` saying how to install it."""
    return optional_module(module, needed_by="The HTML report's pictures", extra="html")


def module_icicle(report: Report, *, by: str = "flops", max_depth: int | None = None) -> Any:
    """The module tree sized by FLOPs (``by="flops"``) or by measured latency (``"time"``).
    ``max_depth``: the modules deeper are left out, and a box at that depth is its whole
    inclusive count (its children's work in it, undivided)."""
    go = plotly()
    value_of = magnitude(report)
    shown_modules = [m for m in report.modules if max_depth is None or m.depth <= max_depth]
    cut = {m.path for m in shown_modules if m.depth == max_depth}
    if by == "time":
        if report.runtime is None:
            raise ValueError("an icicle by time needs a measured report (exportflops.profile)")
        timed = {m.path: m for m in report.runtime.modules}
        modules = [m for m in shown_modules if m.path in timed]
        own = [timed[m.path].inclusive_s if m.path in cut else timed[m.path].exclusive_s
               for m in modules]
        shown = [_STYLE.seconds(timed[m.path].inclusive_s) for m in modules]
        share = [_STYLE.percent(timed[m.path].inclusive_s, timed[""].inclusive_s)
                 for m in modules]
    else:
        modules = shown_modules
        own = [value_of((m.inclusive if m.path in cut else m.exclusive).flops) for m in modules]
        shown = [_STYLE.count(m.inclusive.flops, "FLOPs") for m in modules]
        share = [_STYLE.percent(m.inclusive.flops, report.total.flops) for m in modules]
    ids = [_box_id(m.path) for m in modules]
    figure = go.Figure(go.Icicle(
        ids=ids,
        labels=[short_name(m.path) or _short(report.model) for m in modules],
        parents=["" if not m.path else _box_id(parent(m.path)) for m in modules],
        values=own,
        branchvalues="remainder",
        customdata=[[m.path or "(root)", short_name(m.type), s, p]
                    for m, s, p in zip(modules, shown, share)],
        hovertemplate=("%{customdata[0]}<br>%{customdata[1]}<br>%{customdata[2]} "
                       "(%{customdata[3]} of the model)<extra></extra>"),
        tiling={"orientation": "v"},
        root={"color": "lightgrey"},
    ))
    title = "Modules by measured time" if by == "time" else "Modules by FLOPs"
    figure.update_layout(title=title, margin={"t": 40, "l": 10, "r": 10, "b": 10}, height=420)
    return figure


def plotted_nodes(report: Report) -> list[NodeRecord]:
    """The nodes the scatter places: counted, with FLOPs and bytes (a log axis has no 0), and a
    measured rate when the report was measured."""
    rates = _achieved(report)
    return [n for n in report.nodes
            if n.status == "counted" and _value(report, n.cost.flops) > 0
            and _bytes(report, n) > 0 and (rates is None or rates.get(n.name))]


def roofline_scatter(report: Report, *, roofline: RooflineLike | None = None,
                     peaks: Mapping[str, float] | None = None,
                     bandwidth_byte_per_s: float | None = None) -> Any:
    """Intensity against FLOP/s (or FLOPs) per node, with the roofs when given: ``peaks`` maps
    a label to a compute peak in FLOP/s, ``bandwidth_byte_per_s`` is the memory roof."""
    go = plotly()
    nodes = plotted_nodes(report)
    predicted = {} if roofline is None else {n.name: n for n in roofline.nodes}
    x = {n.name: (predicted[n.name].intensity if n.name in predicted
                  else intensity(report, n.cost)) for n in nodes}
    rates = _achieved(report)
    figure = go.Figure()
    if rates is not None:
        _add_points(figure, go, report, nodes, x,
                    {n.name: rates[n.name] for n in nodes}, "measured", "circle")
    for bound in ("compute", "memory"):
        chosen = [n for n in nodes if n.name in predicted and predicted[n.name].bound == bound
                  and predicted[n.name].predicted_s > 0]
        ys = {n.name: _value(report, n.cost.flops) / predicted[n.name].predicted_s
              for n in chosen}
        if chosen:
            _add_points(figure, go, report, chosen, x, ys, f"predicted, {bound}-bound",
                        "x-thin-open", by_op=False)
    rate_axis = rates is not None or bool(predicted)
    if not rate_axis:
        _add_points(figure, go, report, nodes, x,
                    {n.name: _value(report, n.cost.flops) for n in nodes}, "", "circle")
    else:
        _add_roofs(figure, go, list(x.values()), peaks or {}, bandwidth_byte_per_s)
    y_title = ("FLOP/s (achieved: FLOPs / median latency; predicted: FLOPs / predicted time)"
               if rate_axis else "FLOPs of the node (profile the model, or pass a roofline, "
                                 "to plot rates)")
    figure.update_layout(
        title="Nodes: arithmetic intensity against FLOP/s" if rate_axis
        else "Nodes: arithmetic intensity against FLOPs",
        xaxis={"type": "log", "title": "arithmetic intensity (FLOPs per byte read and written)"},
        yaxis={"type": "log", "title": y_title},
        height=520, margin={"t": 40, "l": 10, "r": 10, "b": 10}, legend={"title": "op"})
    return figure


def roofline_record_scatter(roofline: Roofline, *, top: int | None = None) -> Any:
    """A `Roofline` alone (no report needed): each node with FLOPs and bytes at its intensity
    and its predicted FLOP/s (FLOPs / predicted time, which sits on the roof by construction),
    marked by its bound, and its achieved FLOP/s when measured; the roofs of the dtypes the
    nodes run at and the memory roof. ``top``: only the nodes with the longest predicted time
    (the rest left out, and the title says how many)."""
    go = plotly()
    nodes = [n for n in roofline.nodes if n.intensity and n.predicted_s > 0]
    if top is not None and len(nodes) > top:
        kept = {n.name for n in sorted(nodes, key=lambda n: -n.predicted_s)[:top]}
        left_out = f", the {top} slowest of {len(nodes)} nodes"
        nodes = [n for n in nodes if n.name in kept]
    else:
        left_out = ""
    figure = go.Figure()
    for bound, color in (("compute", COLORS["flops"]), ("memory", COLORS["bytes"])):
        _add_roofline_nodes(figure, go, [n for n in nodes if n.bound == bound],
                            f"predicted, {bound}-bound", "predicted_s", color, "circle")
    _add_roofline_nodes(figure, go, [n for n in nodes if n.measured_s], "measured",
                        "measured_s", "#222222", "x-thin-open")
    peaks = {f"{n.dtype} peak {_STYLE.count(n.peak_flop_per_s)}FLOP/s": n.peak_flop_per_s
             for n in nodes}
    _add_roofs(figure, go, [n.intensity for n in nodes], peaks, roofline.bandwidth_bytes_per_s)
    figure.update_layout(
        title={"text": f"{roofline.model} on {roofline.device}: each node's FLOP/s under the "
                       f"roofs{left_out}", "font": {"size": 13}},
        xaxis={"type": "log", "title": "arithmetic intensity (FLOPs per byte read and written)"},
        yaxis={"type": "log", "title": "FLOP/s (FLOPs / predicted or measured time)"},
        height=520, margin={"t": 40, "l": 10, "r": 10, "b": 10})
    return figure


class RankFlops(NamedTuple):
    """What the per-rank bar chart draws of a record: every rank's FLOPs over the step and the
    rank whose time sets it."""

    flops: list[int]
    """FLOPs of rank 0, 1, ...: over the whole step (every microbatch of a pipeline)."""
    step_rank: int
    """The rank that sets the step: the pipeline's slowest, the busiest otherwise."""
    title: str
    """What the chart shows, with the record's layout."""


def _pipeline_flops(record: PipelineReport) -> RankFlops:
    per_microbatch = [0] * record.pp
    for stage in record.stages:
        per_microbatch[stage.rank] += stage.forward.flops + stage.backward.flops
    return RankFlops(
        [record.microbatches * f for f in per_microbatch], record.slowest_rank,
        f"{record.model}: FLOPs per pipeline rank over a step of {record.microbatches} "
        f"microbatches ({record.mode}); rank {record.slowest_rank} ends the step")


def _expert_flops(record: ExpertParallelReport) -> RankFlops:
    return RankFlops(
        [r.total.flops for r in record.ranks], record.busiest_rank,
        f"{record.model}: FLOPs per expert-parallel rank ({record.mode}, "
        f"{'balanced routing' if record.balanced else 'the given routing'}); "
        f"rank {record.busiest_rank} is the busiest")


def _context_flops(record: ContextParallelReport) -> RankFlops:
    split = "round-robin" if record.load_balanced else "contiguous blocks"
    return RankFlops(
        [r.flops for r in record.ranks], record.busiest.rank,
        f"{record.model}: FLOPs per context-parallel rank ({record.mode}, {split}); "
        f"rank {record.busiest.rank} is the busiest")


#: Each per-rank record and how its ranks' FLOPs are read.
RANK_FLOPS: dict[type, Callable[[Any], RankFlops]] = {
    PipelineReport: _pipeline_flops,
    ExpertParallelReport: _expert_flops,
    ContextParallelReport: _context_flops,
}


def rank_flops(record: PipelineReport | ExpertParallelReport | ContextParallelReport,
               ) -> RankFlops:
    """Every rank's FLOPs over the step and the rank that sets it."""
    reader = RANK_FLOPS.get(type(record))
    if reader is None:
        raise TypeError(f"no per-rank FLOPs for a {type(record).__name__}: the per-rank "
                        f"records are {', '.join(t.__name__ for t in RANK_FLOPS)}")
    return reader(record)


def rank_flops_bars(record: PipelineReport | ExpertParallelReport | ContextParallelReport,
                    ) -> Any:
    """One bar per rank, as high as its FLOPs over the step; the rank that sets the step hatched
    and labelled (the color stays the FLOPs color: it means the same everywhere)."""
    go = plotly()
    drawn = rank_flops(record)
    ranks = [f"rank {r}" for r in range(len(drawn.flops))]
    step_rank = [r == drawn.step_rank for r in range(len(drawn.flops))]
    figure = go.Figure(go.Bar(
        x=ranks, y=drawn.flops, name="FLOPs",
        marker={"color": COLORS["flops"],
                "pattern": {"shape": ["/" if s else "" for s in step_rank]},
                "line": {"color": "#222222", "width": [2 if s else 0 for s in step_rank]}},
        text=["sets the step" if s else "" for s in step_rank], textposition="outside",
        customdata=[str(_STYLE.count(f, "FLOPs")) for f in drawn.flops],
        hovertemplate="%{x}: %{customdata}<extra></extra>"))
    figure.update_layout(title={"text": drawn.title, "font": {"size": 13}},
                         yaxis={"title": "FLOPs"}, height=380, showlegend=False,
                         margin={"t": 50, "l": 10, "r": 10, "b": 10})
    return figure


#: Each kind of pipeline action as the timeline's legend names it.
_ACTIONS = {"forward": "forward", "backward": "backward",
            "backward_input": "backward, input gradients (I)",
            "backward_weight": "backward, weight gradients (W)",
            "unshard": "parameters gathered, once per step",
            "reduce_grad": "gradient reduction, once per step"}


def pipeline_timeline(record: PipelineReport) -> Any:
    """The step's actions per rank (rank 0 on top): a bar from each action's start to its end,
    forward and backward (or its input and weight passes) in their colors, the microbatch on
    the bar; the gaps are the ranks' idle time."""
    go = plotly()
    unit = "units" if record.device == "unit" else "s"
    figure = go.Figure()
    for kind, name in _ACTIONS.items():
        actions = [a for a in record.timeline if a.kind == kind]
        if not actions:
            continue
        figure.add_trace(go.Bar(
            y=[f"rank {a.rank}" for a in actions], base=[a.start_s for a in actions],
            x=[a.end_s - a.start_s for a in actions], orientation="h", name=name,
            marker={"color": COLORS[kind], "line": {"color": "white", "width": 1}},
            text=[str(a.microbatch) if a.microbatch is not None else "" for a in actions],
            textposition="inside", insidetextanchor="middle",
            customdata=[[a.stage, "the step" if a.microbatch is None else
                         f"microbatch {a.microbatch}", a.start_s, a.end_s] for a in actions],
            hovertemplate=(f"{name} of stage %{{customdata[0]}} on %{{customdata[1]}}<br>"
                           f"%{{customdata[2]:.4g}} to %{{customdata[3]:.4g}} {unit}"
                           f"<extra>%{{y}}</extra>")))
    bubble = _STYLE.percent(record.bubble_fraction, 1)
    figure.update_layout(
        title={"text": f"{record.model}: schedule {record.schedule}, {record.pp} ranks x "
                       f"{record.microbatches} microbatches: bubble {bubble} of all ranks' time",
               "font": {"size": 13}},
        barmode="overlay", bargap=0.25,
        xaxis={"title": f"time ({'unit times, 1 per action' if unit == 'units' else 's'})",
               "range": [0, record.step_time_s]},
        yaxis={"categoryorder": "array", "autorange": "reversed",
               "categoryarray": [f"rank {r.rank}" for r in record.ranks]},
        height=120 + 40 * record.pp, margin={"t": 50, "l": 10, "r": 10, "b": 10},
        legend={"orientation": "h", "y": -0.25})
    return figure


def intensity(report: Report, cost: Cost) -> float | None:
    """FLOPs per byte read and written (at the example sizes for dynamic counts); None without
    bytes."""
    moved = _value(report, cost.bytes_moved)
    return _value(report, cost.flops) / moved if moved else None


def _add_points(figure: Any, go: Any, report: Report, nodes: list[NodeRecord],
                xs: dict[str, float], ys: dict[str, float], label: str, symbol: str, *,
                by_op: bool = True) -> None:
    """One scatter trace per op (or one for all), one marker per node."""
    groups: dict[str, list[NodeRecord]] = defaultdict(list)
    for node in nodes:
        groups[_op_label(node.op) if by_op else label].append(node)
    for name, members in groups.items():
        figure.add_trace(go.Scatter(
            x=[xs[n.name] for n in members], y=[ys[n.name] for n in members],
            mode="markers", name=f"{name} ({label})" if by_op and label else name,
            marker={"symbol": symbol, "size": 9},
            customdata=[[n.name, n.op, n.module or "(root)",
                         _STYLE.count(n.cost.flops, "FLOPs"),
                         _STYLE.count(_bytes(report, n), "B")] for n in members],
            hovertemplate=("%{customdata[0]}: %{customdata[1]}<br>module %{customdata[2]}<br>"
                           "%{customdata[3]}, %{customdata[4]}<br>intensity %{x:.3g} FLOP/B"
                           "<br>%{y:.3g}<extra></extra>"),
        ))


def _add_roofline_nodes(figure: Any, go: Any, nodes: Sequence[Any], name: str, time: str,
                        color: str, symbol: str) -> None:
    """One trace of a `Roofline`'s nodes at their FLOPs / ``time`` (``predicted_s`` or
    ``measured_s``)."""
    if not nodes:
        return
    seconds = [getattr(n, time) for n in nodes]
    figure.add_trace(go.Scatter(
        x=[n.intensity for n in nodes], y=[n.flops / s for n, s in zip(nodes, seconds)],
        mode="markers", name=name, marker={"symbol": symbol, "size": 8, "color": color},
        customdata=[[n.name, n.op, n.module or "(root)", _STYLE.count(n.flops, "FLOPs"),
                     _STYLE.count(n.bytes, "B"), _STYLE.seconds(s)]
                    for n, s in zip(nodes, seconds)],
        hovertemplate=("%{customdata[0]}: %{customdata[1]}<br>module %{customdata[2]}<br>"
                       "%{customdata[3]}, %{customdata[4]} in %{customdata[5]}<br>"
                       "intensity %{x:.3g} FLOP/B<br>%{y:.3g} FLOP/s<extra></extra>")))


def _add_roofs(figure: Any, go: Any, intensities: list[float], peaks: Mapping[str, float],
               bandwidth: float | None) -> None:
    """The compute peaks as horizontal lines from the ridge on, the memory roof up to it."""
    if not intensities:
        return
    low, high = min(intensities) / 4, max(intensities) * 4
    for label, peak in peaks.items():
        ridge = peak / bandwidth if bandwidth else low
        if bandwidth:
            low, high = min(low, ridge / 4), max(high, ridge * 4)
        figure.add_trace(go.Scatter(x=[max(ridge, low), high], y=[peak, peak], mode="lines",
                                    name=f"roof: {label}", line={"dash": "dash"}))
    if bandwidth:
        top = max(peaks.values()) if peaks else bandwidth * high
        figure.add_trace(go.Scatter(x=[low, top / bandwidth], y=[bandwidth * low, top],
                                    mode="lines", line={"dash": "dot"},
                                    name=f"roof: memory {_STYLE.count(bandwidth)}B/s"))


def _achieved(report: Report) -> dict[str, float | None] | None:
    if report.runtime is None:
        return None
    return {t.name: t.achieved_flop_per_s for t in report.runtime.nodes}


def _value(report: Report, count: Any) -> float:
    return magnitude(report)(count)


def _bytes(report: Report, node: NodeRecord) -> float:
    return _value(report, node.cost.bytes_moved)


def _op_label(op: str) -> str:
    """``aten.linear.default`` -> ``linear``: the legend's short name of an op."""
    namespace, _, rest = op.partition(".")
    name = rest.rpartition(".")[0] or rest
    return name if namespace == "aten" else op


def _box_id(path: str) -> str:
    return path or "(root)"


def _short(model: str) -> str:
    return short_name(model) or model
