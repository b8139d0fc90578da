"""``--fit BUDGET``: the checkpointing plan that fits MODEL's training step into BUDGET
(`exportflops.fit`): bytes, a size (80GiB, 40GB) or a device key (h100-sxm); with --tp N
and/or --fsdp N, --pp N (--schedule, --microbatches), --ep N (--routing) or --cp N, per rank of
that layout (the rank with the highest peak decides)."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from .targets import built

#: What --fit does not combine with: the flags of other analyses, by their dest.
_OTHER_ANALYSES = ("memory", "profile", "dims", "points", "budget", "generate", "seqlens",
                   "trace", "split_backward")


def check_fit(ns: argparse.Namespace) -> None:
    """--fit: refused where it cannot apply, before the model is built."""
    if ns.fit is None:
        return
    others = [name for name in _OTHER_ANALYSES if getattr(ns, name) not in (None, False, [], {})]
    if others or ns.model.endswith(".pt2") or ns.view or ns.format not in ("table", "json"):
        raise UsageError("--fit BUDGET plans a training step of a model built here, printed as "
                         "a table or JSON: not a saved .pt2, not with --view, and not with "
                         "--memory, --profile, --trace, --dynamic, --sweep, --budget, "
                         "--generate, --seqlens or --split-backward.")


def analyze_fit(ns: argparse.Namespace):
    """The `FitPlan` of MODEL as the flags build it."""
    from ..errors import LayoutError
    from ..planner import fit
    from .splits import split_flags, split_given, split_options

    model, args, kwargs = built(ns)
    budget = int(ns.fit) if ns.fit.isdigit() else ns.fit
    options = split_options(ns) if split_given(ns) else {}
    try:  # --routing is the example's histogram: no other batch or length has it
        plan = fit(model, args, kwargs, budget=budget, optimizer=ns.optimizer or "adamw",
                   device_model=ns.device_model, search_batch=ns.routing is None, **options)
    except LayoutError as error:  # a layout, or a block, a per-rank step does not model
        raise UsageError(f"--fit {split_flags(ns)}: {error}") from error
    return plan
