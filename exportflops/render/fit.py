"""FitPlan -> text: the plan, its peak and cost, the largest batch and length, and every plan
measured.
Imports no torch."""

from __future__ import annotations

from ..records.fit import FitPlan
from .format import Style

_HEADERS = ("blocks checkpointed", "peak", "fits", "recompute FLOPs", "recompute time")


def fit_plan_view(plan: FitPlan, style: Style = Style()) -> str:
    """The summary (the plan's blocks, peak, recompute, largest batches and lengths) and the
    table of every candidate, the chosen one marked."""
    chosen = (", ".join(plan.checkpointed) if plan.checkpointed
              else f"{', '.join(plan.selective)} (selective)" if plan.selective
              else "nothing: the step fits as it is")
    picked = (len(plan.checkpointed) + len(plan.selective), bool(plan.selective))
    timed = (f", {style.seconds(plan.recompute_time_s)} on {plan.device_model}'s roofs"
             if plan.recompute_time_s is not None else "")
    per_rank = f" per rank of {plan.layout}" if plan.layout else ""
    at_rank = f" (rank {plan.peak_rank}, the highest)" if plan.peak_rank is not None else ""
    lines = [
        f"Fit {plan.model} into {plan.budget} ({style.count(plan.budget_bytes, 'B')}){per_rank}"
        f", training step with {plan.optimizer}",
        f"checkpoint: {chosen}",
        f"peak {style.count(plan.peak_bytes, 'B')}{at_rank}; recompute "
        f"{style.count(plan.recompute_flops, 'FLOP')}{timed}",
        f"largest batch: {_rows(plan.largest_batch)} with the plan, "
        f"{_rows(plan.largest_batch_without_plan)} without (measured at {plan.example_batch})",
    ]
    if plan.largest_length is not None:
        lines.append(f"largest length: {plan.largest_length} tokens with the plan, "
                     f"{plan.largest_length_without_plan} without (measured at "
                     f"{plan.example_length}, at {plan.example_batch} rows)")
    rows = [[f"{c.blocks}{' selective' if c.selective else ''}"
             f"{' (chosen)' if (c.blocks, c.selective) == picked else ''}",
             style.count(c.peak_bytes, "B"), "yes" if c.peak_bytes <= plan.budget_bytes else "no",
             style.count(c.recompute_flops, "FLOP"), style.seconds(c.recompute_time_s)]
            for c in plan.candidates]
    return "\n".join(lines) + "\n\n" + style.titled("Plans measured",
                                                    style.table(rows, _HEADERS, "lrlrr"))


def _rows(rows: int | None) -> str:
    return "not searched" if rows is None else f"{rows} rows"
