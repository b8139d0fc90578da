"""MemoryReport -> text: the peak, the bytes of each kind at the peak and at its own maximum,
and the module tree of saved activations and largest temporaries; and its rows as a pandas
DataFrame (the timeline or the modules). Imports no torch."""

from __future__ import annotations

from typing import Any

from ..errors import optional_module
from ..records.memory import DeviceFit, KindBytes, MemoryOnDevice, MemoryReport
from .format import Style

_KIND_HEADERS = ("kind", "at the peak", "share", "own maximum")
_TREE_HEADERS = ("module", "activations saved", "own", "largest temporary", "made by")


def memory_view(report: MemoryReport | MemoryOnDevice, style: Style = Style(),
                max_depth: int = 3) -> str:
    """The summary, the kinds table (its "at the peak" column sums to the peak, the last row),
    and the module tree to ``max_depth`` (-1: every level); a `MemoryOnDevice` adds whether the
    peak fits its device (`fit_view`)."""
    if isinstance(report, MemoryOnDevice):
        return (memory_view(report.memory, style, max_depth) + "\n\n"
                + fit_view(report.fit, style))
    step = (f"training step ({report.optimizer}, step 2 of the loop)" if report.mode == "train"
            else "forward under no_grad")
    rank = (f" on rank {report.rank} of {report.world_size}" if report.world_size > 1
            else "")
    title = (f"Memory of {report.model}{rank}: {step}; peak {style.count(report.peak_bytes, 'B')} "
             f"in the {report.peak_phase} at {report.peak_node} in "
             f"{report.peak_module or '(root)'}; {_allocator(report)}")
    return "\n\n".join([style.titled(title, _kinds(report, style)),
                        style.titled("Per module", _tree(report, style, max_depth))])


def fit_view(fit: DeviceFit, style: Style = Style()) -> str:
    """One line: whether the peak fits the device, its capacity and the headroom (or what
    is missing)."""
    capacity = style.count(fit.capacity_bytes, "B")
    if fit.fits:
        return (f"Fits {fit.device}: peak {style.count(fit.peak_bytes, 'B')} of {capacity} "
                f"(the datasheet's GB as 10^9 B), {style.count(fit.headroom_bytes, 'B')} to "
                f"spare for what is not tensor storage (CUDA context, workspaces).")
    return (f"Does not fit {fit.device}: peak {style.count(fit.peak_bytes, 'B')} over its "
            f"{capacity} (the datasheet's GB as 10^9 B) by "
            f"{style.count(-fit.headroom_bytes, 'B')}.")


def _allocator(report: MemoryReport) -> str:
    return ("storage bytes" if report.allocator == "exact"
            else "storages rounded up to the CUDA allocator's 512-byte blocks")


def _kinds(report: MemoryReport, style: Style) -> str:
    rows = [[kind, style.count(getattr(report.by_kind, kind), "B"),
             style.percent(getattr(report.by_kind, kind), report.peak_bytes),
             style.count(getattr(report.max_by_kind, kind), "B")]
            for kind in KindBytes.model_fields]
    rows.append(["total", style.count(report.peak_bytes, "B"),
                 style.percent(report.peak_bytes, report.peak_bytes), "-"])
    return style.table(rows, _KIND_HEADERS, "lrrr")


def _tree(report: MemoryReport, style: Style, max_depth: int) -> str:
    rows = [[f"{style.indent * module.depth}{module.path or report.model}",
             style.count(module.activations, "B"), style.count(module.own_activations, "B"),
             style.count(module.largest_temporary, "B"), module.largest_temporary_op or "-"]
            for module in report.modules if max_depth == -1 or module.depth <= max_depth]
    return style.table(rows, _TREE_HEADERS, "lrrrl")


#: The row kinds of `MemoryReport.to_pandas`.
MEMORY_ROWS = ("timeline", "modules")
_MODULE_COLUMNS = ("path", "type", "depth", "activations", "own_activations",
                   "largest_temporary", "largest_temporary_op")


def memory_rows(report: MemoryReport, rows: str) -> tuple[list[str], list[list]]:
    """The header and rows of ``rows``: ``timeline``, one row per op (its position, op, module,
    phase, the live bytes of each kind and their total), or ``modules``, one per module."""
    if rows == "timeline":
        kinds = list(KindBytes.model_fields)
        header = ["index", "op", "module", "phase", *kinds, "total"]
        return header, [[point.index, point.op, point.module, point.phase,
                         *(getattr(point.live, kind) for kind in kinds), point.live.total]
                        for point in report.timeline]
    if rows == "modules":
        return list(_MODULE_COLUMNS), [[getattr(module, column) for column in _MODULE_COLUMNS]
                                       for module in report.modules]
    raise ValueError(f"rows must be one of {', '.join(map(repr, MEMORY_ROWS))}, got {rows!r}")


def memory_frame(report: MemoryReport, rows: str) -> Any:
    header, body = memory_rows(report, rows)
    return optional_module("pandas", needed_by="to_pandas", extra="pandas").DataFrame(
        body, columns=header)
