"""``--cp N``: MODEL's sequence split over N ranks that run ring attention
(`exportflops.parallel.context.analyze_context`); with ``--fsdp F`` F such rings inside FSDP2
over F x N ranks (torchtitan's cp inside fsdp), FSDP2's collectives traced on a fake copy of the
model; ``--rank R`` picks the rank whose ring traffic (and FSDP2 collectives) are listed,
``--no-load-balance`` splits into contiguous blocks instead of torch's round-robin."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the single-device report at the example's sizes with rank ``ns.rank``'s collectives,
    (the `ContextParallelReport`, its view showing rank ``ns.rank``'s traffic))."""
    from ..parallel.context import context_split, fsdp_collectives
    from ..render.context import context_view
    from ..training import flops_per_batch

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    try:
        fpb = flops_per_batch(model, args, kwargs, mode=ns.mode)
        record = context_split(fpb, args, kwargs, cp=ns.cp,
                               load_balance=not ns.no_load_balance)
        if ns.fsdp is not None:  # after the split's checks: the FSDP2 trace is the costly part
            record = context_split(fpb, args, kwargs, cp=ns.cp,
                                   load_balance=not ns.no_load_balance, fsdp=ns.fsdp,
                                   fsdp_collectives=fsdp_collectives(
                                       model, args, kwargs, cp=ns.cp, fsdp=ns.fsdp,
                                       mode=ns.mode))
    except InputError as error:
        # The example cannot be split as asked (no sequence, a length that is no multiple of
        # 2 x cp, no attention call, equal batch and sequence sizes): the message names the fix.
        flags = f"--cp {ns.cp}" + (f" --fsdp {ns.fsdp}" if ns.fsdp is not None else "")
        raise UsageError(f"{flags}: {error}") from error
    report = fpb.report.evaluate(**{fpb.batch: record.batch, fpb.seq: record.seq_len})
    report = report.model_copy(update={"world_size": record.world_size(), "rank": ns.rank,
                                       "collectives": record.collectives(ns.rank)})
    return report, (record, partial(context_view, rank=ns.rank))
