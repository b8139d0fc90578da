"""A step's FLOPs on one batch (`StepFlops`): per packed document, then the step's counts."""

from __future__ import annotations

from ..records.training import StepFlops
from .format import Style


def step_view(step: StepFlops, *, model: str, style: Style = Style()) -> str:
    """Each document's own FLOPs (when the row packs documents), then the step's counts: what
    MFU divides (model), with the recompute (hardware), and as the graph runs it (executed)."""
    sizes = ", ".join(f"{name}={value}" for name, value in step.sizes.items())
    parts = []
    if step.documents:
        rows = [[i, d.length, style.count(d.flops), style.percent(d.flops, step.model_flops)]
                for i, d in enumerate(step.documents)]
        parts.append(style.titled(f"{model}: one packed row of {len(rows)} documents ({sizes})",
                                  style.table(rows, ["document", "tokens", "FLOPs", "share"],
                                              "rrrr")))
    counts = [["model (MFU's numerator)", style.count(step.model_flops)],
              ["  of it, matmul", style.count(step.matmul_flops)],
              ["  of it, forward", style.count(step.forward_flops)],
              ["hardware (with recompute)", style.count(step.hardware_flops)],
              ["executed (padding and recompute)", style.count(step.executed_flops)]]
    note = "" if step.complete else "\nSome ops are uncounted: these counts are lower bounds."
    parts.append(style.titled(
        f"{model}: the step's FLOPs ({step.tokens} tokens, {step.padded_tokens} padding)",
        style.table(counts, ["count", "FLOPs"], "lr")) + note)
    return "\n\n".join(parts) + "\n"
