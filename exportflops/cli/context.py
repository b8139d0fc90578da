"""``--cp N``: MODEL's sequence split over N ranks that run ring attention
(`exportflops.parallel.context.analyze_context`); with ``--fsdp F`` F such rings inside FSDP2
over F x N ranks (torchtitan's cp inside fsdp), FSDP2's collectives traced on a fake copy of the
model; with ``--tp T`` T tensor-parallel ranks at each place of each ring, each counted as its
tensor-parallel rank (`exportflops.parallel.context_tp`); ``--rank R`` picks the rank whose
ring traffic (and tensor-parallel and FSDP2 collectives) are listed, ``--no-load-balance``
splits into contiguous blocks instead of torch's round-robin."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .splits import context_flags
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the single-device report at the example's sizes with rank ``ns.rank``'s collectives,
    (the `ContextParallelReport`, its view showing rank ``ns.rank``'s traffic))."""
    from ..parallel.context import context_split, fsdp_collectives
    from ..parallel.context_tp import with_tensor_parallel
    from ..render.context import context_view
    from ..training import flops_per_batch

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    try:
        fpb = flops_per_batch(model, args, kwargs, mode=ns.mode)
        record = context_split(fpb, args, kwargs, cp=ns.cp,
                               load_balance=not ns.no_load_balance)
        if ns.tp is not None:  # after the split's checks: each rank's count is the costly part
            record = with_tensor_parallel(fpb, record, partial(_tensor_parallel_rank, ns, fpb),
                                          tp=ns.tp, fsdp=ns.fsdp)
        elif ns.fsdp is not None:
            record = context_split(fpb, args, kwargs, cp=ns.cp,
                                   load_balance=not ns.no_load_balance, fsdp=ns.fsdp,
                                   fsdp_collectives=fsdp_collectives(
                                       model, args, kwargs, cp=ns.cp, fsdp=ns.fsdp,
                                       mode=ns.mode))
    except InputError as error:
        # The example cannot be split as asked (no sequence, a length that is no multiple of
        # 2 x cp, no attention call, equal batch and sequence sizes): the message names the fix.
        raise UsageError(f"{context_flags(ns)}: {error}") from error
    report = fpb.report.evaluate(**{fpb.batch: record.batch, fpb.seq: record.seq_len})
    report = report.model_copy(update={"world_size": record.world_size(), "rank": ns.rank,
                                       "collectives": record.collectives(ns.rank)})
    return report, (record, partial(context_view, rank=ns.rank))


def _tensor_parallel_rank(ns: argparse.Namespace, fpb, length: int):
    """Rank ``ns.rank``'s tensor-parallel rank of MODEL on ``length`` positions of each row:
    alone on its ``--tp`` group, or with ``--fsdp`` on the mesh (fsdp x cp, tp), FSDP2
    sharding over the fsdp x cp ranks as torchtitan's does (FSDP2 changes no FLOPs, and its
    trace is the quicker capture). Built on fake cpu tensors, where each attention call stays
    one kernel call, whose key and value the ring sends."""
    from .parallel import parallelized

    flat = ns.fsdp * ns.cp if ns.fsdp is not None else None
    rank = ns.rank if flat is not None else ns.rank % ns.tp
    group = argparse.Namespace(**{**vars(ns), "fsdp": flat, "rank": rank})
    _, report, _ = parallelized(group, inputs=partial(fpb.resized, **{fpb.seq: length}),
                                fake=True)
    return report
