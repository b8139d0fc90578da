"""``--ep N``: MODEL's experts sharded over N expert-parallel ranks, each running a batch like
the example (`exportflops.parallel.experts`); ``--routing`` a histogram of token copies per
expert instead of balanced routing; ``--rank R`` the rank whose all-to-alls are listed."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import analyzed, build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``, (the `ExpertParallelReport`, its view)). The report is
    the example batch's single-device count with the rank's all-to-alls: a rank's own counts
    under the routing are the record's."""
    from ..parallel.experts import expert_parallel, moe_sizes
    from ..render.experts import experts_view

    device = device_named(ns.device or "meta")
    model, args, kwargs = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    report = analyzed(ns, model, args, kwargs, strict=ns.strict, mode=ns.mode,
                      fast=not ns.full_export)
    try:
        record = expert_parallel(report, ep=ns.ep, routing=ns.routing,
                                 **moe_sizes(model, args, kwargs))
    except InputError as error:  # the model or the flags do not fit expert parallelism
        raise UsageError(f"--ep {ns.ep}: {error}") from error
    rank = record.ranks[ns.rank]
    report = report.model_copy(update={"world_size": ns.ep, "rank": ns.rank,
                                       "collectives": rank.all_to_alls})
    link = None if ns.link_gbps is None else ns.link_gbps * 1e9
    return report, (record, partial(experts_view, rank=ns.rank, link_bytes_per_s=link))
