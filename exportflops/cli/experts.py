"""``--ep N``: MODEL's experts sharded over N expert-parallel ranks, each running a batch like
the example (`exportflops.parallel.experts`); ``--routing`` a histogram of token copies per
expert instead of balanced routing; ``--rank R`` the rank whose all-to-alls are listed."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options, in_flags


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``, (the `ExpertParallelReport`, its view)). The report is
    the example batch's single-device count with the rank's all-to-alls: a rank's own counts
    under the routing are the record's."""
    from .. import hf
    from ..api import analyze
    from ..parallel.experts import expert_parallel, moe_sizes
    from ..render.experts import experts_view

    device = device_named(ns.device or "meta")
    model, args, kwargs = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    options = {"strict": ns.strict, "mode": ns.mode, "fast": not ns.full_export}
    if ns.model.startswith("hf:"):
        # As the single-device command does: a branch meta cannot decide is decided on cpu.
        on_cpu = (partial(build_target, ns.model, device_named("cpu"), shapes=ns.shapes,
                          kwargs=ns.kwargs, hf_options=hf_options(ns))
                  if ns.device is None else None)
        with in_flags():
            report = hf.analyze_built(hf.Built(model, args, kwargs), on_cpu=on_cpu, **options)
    else:
        report = analyze(model, args, kwargs, **options)
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
