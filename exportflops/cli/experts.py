"""``--ep N``: MODEL's experts sharded over N expert-parallel ranks, each running a batch like
the example (`exportflops.parallel.experts`); with ``--fsdp F`` those ranks sit inside F FSDP2
ranks (torchtitan's ep inside fsdp), FSDP2's collectives traced on a fake copy of the model;
with ``--tp N`` they are the tensor-parallel ranks, each counted as its rank of the model's own
plan with its MoE layers routing its share of the tokens (`exportflops.parallel.experts.tp`);
``--routing`` a histogram of token copies per expert instead of balanced routing; ``--rank R``
the rank whose all-to-alls (and FSDP2 collectives) are listed."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import analyzed, build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``, (the `ExpertParallelReport`, its view)), by
    `exportflops.parallel.experts.ranks` on the flags' `Layout`. The report is the example
    batch's single-device count (with ``--tp``, its tensor-parallel rank's) with the rank's
    collectives: a rank's own counts under the routing are the record's."""
    from ..parallel.experts.ranks import analyze_expert_ranks, expert_rank_report
    from ..render.experts import experts_view
    from .splits import split_flags, split_layout

    device = device_named(ns.device or "meta")
    model, args, kwargs = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    report = analyzed(ns, model, args, kwargs, strict=ns.strict, mode=ns.mode,
                      fast=not ns.full_export)
    try:
        record, report = analyze_expert_ranks(
            model, args, kwargs, layout=split_layout(ns), mode=ns.mode, routing=ns.routing,
            single_device=report, strict=ns.strict, split_backward=ns.split_backward)
    except InputError as error:  # the model or the flags do not fit expert parallelism
        raise UsageError(f"{split_flags(ns)}: {error}") from error
    link = None if ns.link_gbps is None else ns.link_gbps * 1e9
    return expert_rank_report(record, report, ns.rank), \
        (record, partial(experts_view, rank=ns.rank, link_bytes_per_s=link))

