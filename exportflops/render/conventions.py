"""`Conventions` as text: what each stack would log beside the graph's count, then each
stack's difference from it by part. Pure: every number printed is the record's own."""

from __future__ import annotations

from ..records.conventions import Conventions, StackCount
from .format import Style, table


def _exact(value: int | None, style: Style, sign: bool = False) -> str | int | None:
    """Exact FLOPs with thousands separators: a difference of a few FLOPs stays visible."""
    if value is None or not style.as_string:
        return value
    return f"{value:+,}" if sign else f"{value:,}"


def _mfu(value: float | None, style: Style) -> str | float | None:
    if value is None:
        return "-" if style.as_string else None
    return f"{100 * value:.3g}%" if style.as_string else value


def _summary(result: Conventions, style: Style, note_width: int) -> str:
    r = result
    rows = [["exportflops (graph)", _exact(r.graph_flops, style),
             f"{r.graph_flops_per_token:,.1f}", "", _mfu(r.graph_mfu, style), "exact count"]]
    for s in r.stacks:
        relative = (style.percent(s.difference_flops, r.graph_flops) if s.covered else "-")
        per_token = f"{s.flops_per_token:,.1f}" if s.covered else "-"
        rows.append([s.stack, _exact(s.flops, style) if s.covered else "not covered", per_token,
                     relative, _mfu(s.mfu, style), s.source if s.covered else s.reason])
    peak = f"; MFU at {r.step_time_s:g} s per step, {r.peak_source}" if r.step_time_s else ""
    title = (f"{r.model} ({r.model_type}), B={r.rows} T={r.seq}, {r.tokens} tokens: training "
             f"FLOPs per step by each stack's convention{peak}")
    body = table(rows, ["stack", "FLOPs per step", "per token", "vs graph", "MFU", "formula"],
                 "lrrrrl", tablefmt=style.tablefmt,
                 maxcolwidths=[None, None, None, None, None, note_width])
    return style.titled(title, body)


def _terms(result: Conventions, count: StackCount, style: Style, note_width: int) -> str:
    rows = [[t.part, _exact(t.theirs_flops, style), _exact(t.ours_flops, style),
             _exact(t.difference_flops, style, sign=True), t.reason] for t in count.terms]
    rows.append(["total", _exact(count.flops, style), _exact(result.graph_flops, style),
                 _exact(count.difference_flops, style, sign=True), ""])
    body = table(rows, ["part", count.stack, "graph", "difference", "what it is"], "lrrrl",
                 tablefmt=style.tablefmt, maxcolwidths=[None, None, None, None, note_width])
    return style.titled(f"{count.stack} - graph, by part ({count.repository} {count.source})",
                        body)


def conventions_view(result: Conventions, *, style: Style = Style(),
                     note_width: int | None = 60) -> str:
    """Each stack's FLOPs beside the graph's, then each covered stack's difference by part
    (its rows add up to its total row); notes wrapped at ``note_width`` characters."""
    parts = [_summary(result, style, note_width)]
    parts += [_terms(result, s, style, note_width) for s in result.stacks if s.covered]
    return "\n\n".join(parts) + "\n"
