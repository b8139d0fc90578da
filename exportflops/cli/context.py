"""``--cp N``: MODEL's sequence split over N ranks that run ring attention
(`exportflops.parallel.context.analyze_context`); ``--rank R`` picks the rank whose ring traffic
is listed, ``--no-load-balance`` splits into contiguous blocks instead of torch's round-robin."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the single-device report at the example's sizes, (the `ContextParallelReport`, its
    view showing rank ``ns.rank``'s traffic))."""
    from ..parallel.context import context_split
    from ..render.context import context_view
    from ..training import flops_per_batch

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    try:
        fpb = flops_per_batch(model, args, kwargs, mode=ns.mode)
        record = context_split(fpb, args, kwargs, cp=ns.cp,
                               load_balance=not ns.no_load_balance)
    except InputError as error:
        # The example cannot be split as asked (no sequence, a length that is no multiple of
        # 2 x cp, no attention call, equal batch and sequence sizes): the message names the fix.
        raise UsageError(str(error)) from error
    report = fpb.report.evaluate(**{fpb.batch: record.batch, fpb.seq: record.seq_len})
    return report, (record, partial(context_view, rank=ns.rank))
