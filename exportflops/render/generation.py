"""GenerationReport -> the per-token table: the prefill, the decode step at a few context
lengths, and the whole request. Imports no torch."""

from __future__ import annotations

from ..records import Cost
from ..records.generation import GenerationReport
from .format import Style

_HEADERS = ("phase", "tokens", "keys attended", "FLOPs", "MACs", "bytes read", "bytes written",
            "KV cache read", "FLOPs/byte")


def default_contexts(report: GenerationReport) -> list[int]:
    """The first, middle and last decode step of the request (``past`` of each)."""
    steps = report.decode_positions
    return sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if steps else []


def generation_view(report: GenerationReport, style: Style = Style(),
                    contexts: list[int] | None = None) -> str:
    """One row for the prefill, one per decode step at ``past`` in ``contexts`` (default: the
    request's first, middle and last step), one for the request. Arithmetic intensity is FLOPs
    over bytes read and written."""
    b, p = report.batch, report.prompt_len
    static = report.cache == "static"
    start = report.first_past or 0  # an encoder-decoder's prefill also decodes a start token
    rows = [_row(style, "prefill", b * (p + start), p if not static else report.max_cache_len,
                 report.prefill.total, None)]
    for past in default_contexts(report) if contexts is None else contexts:
        keys = report.max_cache_len if static else past + 1
        if report.windows_full(past):
            keys = f"{past + 1} ({report.sliding_window} sliding)"
        rows.append(_row(style, f"decode, past={past}", b, keys, report.step_counts(past),
                         report.kv_cache_at(past).bytes_read))
    rows.append(_row(style, "request", b * (p + start + report.new_tokens - 1), None, report.total,
                     None))
    work = (f"executed work, static cache of {report.max_cache_len} entries (attention over "
            f"every entry, padding included)" if static else
            "useful work, dynamic cache (attention over the cached tokens and the new one)")
    title = (f"Generation of {report.model}: batch {b}, prompt {p}, {report.new_tokens} new "
             f"tokens; {work}")
    return style.titled(title, style.table(rows, _HEADERS, "lrrrrrrrr"))


def generation_rows(report: GenerationReport) -> tuple[list[str], list[list]]:
    """The header and rows of a generation's `to_csv` and `to_pandas`: the prefill, then every
    decode step the request runs (``past`` = tokens already cached), each step's counts
    evaluated at its ``past``; the rows' counts sum to ``report.total``. ``kv_cache_*`` is the
    part of a decode step's bytes that is the KV cache (None for the prefill)."""
    fields = list(Cost.model_fields)
    header = (["phase", "past", "tokens", *fields, "kv_cache_bytes_read",
               "kv_cache_bytes_written"])
    start = report.first_past or 0  # an encoder-decoder's prefill also decodes a start token
    rows = [["prefill", None, report.batch * (report.prompt_len + start),
             *(getattr(report.prefill.total, f) for f in fields), None, None]]
    for past in report.decode_positions:
        step, kv = report.step_counts(past), report.kv_cache_at(past)
        rows.append(["decode", past, report.batch, *(getattr(step, f) for f in fields),
                     kv.bytes_read, kv.bytes_written])
    return header, rows


def _row(style: Style, phase: str, tokens: int, keys: int | None, cost: Cost,
         kv_read: int | None) -> list:
    moved = cost.bytes_moved
    return [phase, tokens, keys, style.count(cost.flops), style.count(cost.macs, "MACs"),
            style.count(cost.bytes_read, "B"), style.count(cost.bytes_written, "B"),
            None if kv_read is None else style.count(kv_read, "B"),
            style.ratio(cost.flops, moved)]
