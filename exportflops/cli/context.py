"""``--cp N``: MODEL's sequence split over N ranks that run ring attention
(`exportflops.parallel.context.analyze_context`); with ``--fsdp F`` F such rings inside FSDP2
over F x N ranks (torchtitan's cp inside fsdp), FSDP2's collectives traced on a fake copy of the
model; with ``--tp T`` T tensor-parallel ranks at each place of each ring, each counted as its
tensor-parallel rank (`exportflops.parallel.context.tp`); ``--rank R`` picks the rank whose
ring traffic (and tensor-parallel and FSDP2 collectives) are listed, ``--no-load-balance``
splits into contiguous blocks instead of torch's round-robin."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the single-device report at the example's sizes with rank ``ns.rank``'s collectives,
    (the `ContextParallelReport`, its view showing rank ``ns.rank``'s traffic)), by
    `exportflops.parallel.context.ranks` on the flags' `Layout`."""
    from ..parallel.context.ranks import analyze_context_ranks, context_rank_report
    from ..render.context import context_view
    from .splits import context_flags, split_layout

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    try:
        record, fpb = analyze_context_ranks(
            model, args, kwargs, layout=split_layout(ns), mode=ns.mode,
            load_balance=not ns.no_load_balance, rank=ns.rank, strict=ns.strict,
            split_backward=ns.split_backward)
    except InputError as error:
        # The example cannot be split as asked (no sequence, a length that is no multiple of
        # 2 x cp, no attention call, equal batch and sequence sizes): the message names the fix.
        raise UsageError(f"{context_flags(ns)}: {error}") from error
    return context_rank_report(record, fpb, ns.rank), \
        (record, partial(context_view, rank=ns.rank))
