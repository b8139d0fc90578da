"""``--memory``: the memory of one step of MODEL (`exportflops.memory`), ``--mode train`` with
``--optimizer`` and ``--precision``, and with ``--device-model KEY`` whether its peak fits that
device's memory; with split flags, of the step of rank ``--rank``
(`exportflops.parallel.memory_ranks`). ``--fit BUDGET``: the checkpointing plan that fits the
training step into BUDGET (`exportflops.fit`), per rank with split flags."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import LayoutError, UsageError
from ..outputs import Results
from .splits import split_flagged, split_flags, split_given, split_options
from .targets import built, flags

#: What --memory does not combine with: the flags of other analyses, by their dest.
_OTHER_ANALYSES = ("profile", "points", "budget", "generate", "seqlens", "trace",
                   "split_backward")


def check_memory(ns: argparse.Namespace) -> None:
    """--memory and --optimizer: refused where they cannot apply, before the model is built."""
    if ns.optimizer is not None and not ((ns.memory and ns.mode == "train")
                                         or ns.fit is not None):
        raise UsageError("--optimizer picks the optimizer of --memory --mode train's step, "
                         "or of the step --fit plans.")
    if ns.precision is not None and not (ns.memory and ns.mode == "train"
                                         and not split_given(ns)):
        raise UsageError("--precision sets the dtypes of --memory --mode train's step on one "
                         "device: not without --memory --mode train, nor with --tp, --fsdp, "
                         "--pp, --ep or --cp.")
    if not ns.memory:
        return
    others = [name for name in _OTHER_ANALYSES if getattr(ns, name) not in (None, False, [], {})]
    if (others or ns.model.endswith(".pt2") or ns.view
            or ns.format not in ("table", "md", "json", "html")):
        raise UsageError("--memory prints one step's memory of a model built here as a table, "
                         "Markdown, JSON or an HTML page (--depth for the module tree): not a "
                         "saved .pt2, "
                         "not with --view, and not with --profile, --trace, --sweep, "
                         "--budget, --generate, --seqlens or --split-backward (--tp and "
                         "--fsdp, --pp, --ep or --cp: one rank's step).")
    if ns.dims and split_given(ns):
        raise UsageError("--memory --dynamic gives one device's step in dynamic sizes: not "
                         "with --tp, --fsdp, --pp, --ep or --cp.")
    if ns.device_model is not None:
        from ..device_table import DEVICES

        sized = [d.key for d in DEVICES if d.memory_bytes is not None]
        if ns.device_model not in sized:
            raise UsageError(f"--memory --device-model {ns.device_model!r}: the device table "
                             f"knows the memory of {', '.join(sized)}.")


def analyze_memory(ns: argparse.Namespace) -> Results:
    """The `MemoryReport`, or with --device-model the `MemoryOnDevice`."""
    from ..records.memory import MemoryOnDevice

    if ns.dims:
        return _symbolic_memory(ns)
    record = _rank_memory(ns) if split_given(ns) else _memory(ns)
    if ns.device_model is not None:
        record = MemoryOnDevice(memory=record, fit=record.fits(ns.device_model))
    return Results(record=record)


def _memory(ns: argparse.Namespace, dynamic: bool = False):
    """`exportflops.memory` of MODEL with --mode, --optimizer and --precision; ``dynamic``:
    in --dynamic's sizes."""
    from .. import memory
    from .targets import dynamic_shapes

    model, args, kwargs = built(ns)
    shapes = dynamic_shapes(ns, model, args, kwargs, {}) if dynamic else None
    return memory(model, args, kwargs, mode=ns.mode, optimizer=ns.optimizer or "adamw",
                  precision=ns.precision or "32-true", dynamic_shapes=shapes)


def _symbolic_memory(ns: argparse.Namespace):
    """--memory --dynamic: the step's memory in those sizes (`SymbolicMemoryReport`); with
    --device-model, the largest value of each size whose peak fits its memory, the others at
    the example's (`SymbolicMemoryReport.largest_each`)."""
    from ..device_table import device_row
    from ..render.symbolic_memory import symbolic_memory_view

    report = _memory(ns, dynamic=True)
    largest, budget = {}, ""
    if ns.device_model is not None:
        budget = f"{ns.device_model} ({device_row(ns.device_model).memory_bytes} bytes)"
        largest = report.largest_each(ns.device_model)
    return Results(record=report, view=lambda record, style: symbolic_memory_view(
        record, style, largest, budget) + "\n")


def _rank_memory(ns: argparse.Namespace):
    """The step of rank --rank of MODEL split by --tp and --fsdp, by --pp (its input one
    microbatch of --microbatches, under --schedule; with --tp and --fsdp on each stage), by
    --ep (--routing) or by --cp (with --fsdp and --tp)."""
    from ..parallel.rank_memory import memory_ranks

    # A model without a plan, an example the layout cannot split: errors naming the flags.
    with split_flagged(ns):
        return memory_ranks(partial(built, ns), rank=ns.rank, mode=ns.mode,
                            optimizer=ns.optimizer or "adamw", **split_options(ns))


def analyze_fit(ns: argparse.Namespace):
    """The `FitPlan` of MODEL as the flags build it."""
    from ..planner import fit

    model, args, kwargs = built(ns)
    budget = int(ns.fit) if ns.fit.isdigit() else ns.fit
    options = split_options(ns) if split_given(ns) else {}
    try:  # --routing is the example's histogram: no other batch or length has it
        plan = fit(model, args, kwargs, budget=budget, optimizer=ns.optimizer or "adamw",
                   device_model=ns.device_model, search_batch=ns.routing is None, **options)
    except LayoutError as error:  # a layout, or a block, a per-rank step does not model
        raise UsageError(f"--fit {split_flags(ns)}: {flags(str(error))}") from error
    return plan
