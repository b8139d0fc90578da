"""SymbolicMemoryReport -> text: the sizes, the peak at the example's sizes, every candidate
op's live bytes as a polynomial, and the largest sizes that fit a budget. Imports no torch."""

from __future__ import annotations

from ..records.symbolic_memory import SymbolicMemoryReport
from .format import Style

_HEADERS = ("op", "phase", "module", "live bytes")


def symbolic_memory_view(report: SymbolicMemoryReport, style: Style = Style(),
                         largest: dict[str, int] | None = None, budget: str = "") -> str:
    """The summary, the candidates' table and, given ``largest`` (size -> the largest value
    whose peak fits ``budget``, the other sizes at the example's), a line per size."""
    at = report.example_sizes()
    example = report.evaluate(**at)
    sizes = ", ".join(f"{s.name} in [{s.min}, {s.max if s.max else 'inf'}] (example "
                      f"{s.example})" for s in report.sizes)
    step = f"training step with {report.optimizer}" if report.mode == "train" else "forward"
    lines = [
        f"Memory of {report.model}, {step}, in sizes {sizes}",
        f"polynomials from {len(report.sampled)} steps ({_at(report.sampled[0])} .. "
        f"{_at(report.sampled[-1])}), checked at {_at(report.verified_at)}",
        f"peak: the largest of {len(report.candidates)} candidate ops; at {_at(at)} "
        f"{style.count(example.peak_bytes, 'B')} at {example.peak_node} "
        f"({example.peak_phase}, {example.peak_module or 'the root'})",
    ]
    lines += [f"largest {name} that fits {budget}: {value}" for name, value in
              (largest or {}).items()]
    rows = [[f"{p.op} #{p.index}", p.phase, p.module,
             " + ".join(f"{kind} {getattr(p.live, kind)}" for kind in type(p.live).model_fields
                        if getattr(p.live, kind) != "0")]
            for p in report.candidates]
    return "\n".join(lines) + "\n\n" + style.titled("Candidate ops (live bytes by kind)",
                                                    style.table(rows, _HEADERS, "llll"))


def _at(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sizes.items())
