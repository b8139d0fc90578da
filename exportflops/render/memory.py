"""MemoryReport -> text: the peak, the bytes of each kind at the peak and at its own maximum,
and the module tree of saved activations and largest temporaries. Imports no torch."""

from __future__ import annotations

from ..records.memory import KindBytes, MemoryReport
from .format import Style

_KIND_HEADERS = ("kind", "at the peak", "share", "own maximum")
_TREE_HEADERS = ("module", "activations saved", "own", "largest temporary", "made by")


def memory_view(report: MemoryReport, style: Style = Style(), max_depth: int = 3) -> str:
    """The summary, the kinds table (its "at the peak" column sums to the peak, the last row),
    and the module tree to ``max_depth``."""
    step = (f"training step ({report.optimizer}, step 2 of the loop)" if report.mode == "train"
            else "forward under no_grad")
    title = (f"Memory of {report.model}: {step}; peak {style.count(report.peak_bytes, 'B')} "
             f"in the {report.peak_phase} at {report.peak_node} in "
             f"{report.peak_module or '(root)'}; {_allocator(report)}")
    return "\n\n".join([style.titled(title, _kinds(report, style)),
                        style.titled("Per module", _tree(report, style, max_depth))])


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
            for module in report.modules if module.depth <= max_depth]
    return style.table(rows, _TREE_HEADERS, "lrrrl")
