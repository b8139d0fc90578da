"""``--ep N``: MODEL's experts sharded over N expert-parallel ranks, each running a batch like
the example (`exportflops.parallel.experts`); with ``--fsdp F`` those ranks sit inside F FSDP2
ranks (torchtitan's ep inside fsdp), FSDP2's collectives traced on a fake copy of the model;
with ``--tp N`` they are the tensor-parallel ranks, each counted as its rank of the model's own
plan with its MoE layers routing its share of the tokens (`exportflops.parallel.experts_tp`);
``--routing`` a histogram of token copies per expert instead of balanced routing; ``--rank R``
the rank whose all-to-alls (and FSDP2 collectives) are listed."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import analyzed, build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``, (the `ExpertParallelReport`, its view)). The report is
    the example batch's single-device count (with ``--tp``, its tensor-parallel rank's) with the
    rank's collectives: a rank's own counts under the routing are the record's."""
    from ..parallel.experts import expert_parallel, moe_sizes
    from ..parallel.experts_fsdp import fsdp_collectives
    from ..render.experts import experts_view
    from ..parallel.parallelize import tensor_parallel

    device = device_named(ns.device or "meta")
    model, args, kwargs = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    report = analyzed(ns, model, args, kwargs, strict=ns.strict, mode=ns.mode,
                      fast=not ns.full_export)
    try:
        sizes = moe_sizes(model, args, kwargs)
        # The expert-parallel checks first, on the single-device report: the tensor-parallel
        # rank's count and the FSDP2 trace are the costly parts.
        layout = {"fsdp": ns.fsdp,
                  **({"tp": ns.tp, "single_device": report} if ns.tp is not None else {})}
        record = expert_parallel(report, ep=ns.ep, routing=ns.routing, **layout, **sizes)
        if ns.fsdp is not None:
            layout["fsdp_collectives"] = fsdp_collectives(
                model, args, kwargs, ep=ns.ep, fsdp=ns.fsdp, num_experts=sizes["num_experts"],
                mode=ns.mode, tp=ns.tp,
                parallelize=None if ns.tp is None else partial(tensor_parallel,
                                                               experts="experts"))
        if ns.tp is not None:
            report = _tensor_parallel_rank(ns)
        if ns.fsdp is not None or ns.tp is not None:
            record = expert_parallel(report, ep=ns.ep, routing=ns.routing, **layout, **sizes)
    except InputError as error:  # the model or the flags do not fit expert parallelism
        flags = f"--ep {ns.ep}" + "".join(f" --{name} {getattr(ns, name)}" for name in
                                          ("fsdp", "tp") if getattr(ns, name) is not None)
        raise UsageError(f"{flags}: {error}") from error
    report = report.model_copy(update={"world_size": record.world_size(), "rank": ns.rank,
                                       "collectives": record.collectives(ns.rank)})
    link = None if ns.link_gbps is None else ns.link_gbps * 1e9
    return report, (record, partial(experts_view, rank=ns.rank, link_bytes_per_s=link))


def _tensor_parallel_rank(ns: argparse.Namespace):
    """Tensor-parallel rank 0 of MODEL with each MoE layer routing its share of the tokens
    (`exportflops.parallel.experts_tp`), its routers' gradient all-reduces listed in training."""
    from ..parallel.experts_tp import router_gradient_reductions
    from .parallel import parallelized

    # FSDP2 changes no FLOPs: one rank of the tp group alone counts the work.
    model, report, _ = parallelized(argparse.Namespace(**{**vars(ns), "rank": 0, "fsdp": None}),
                                    experts="experts")
    if ns.mode != "train":
        return report
    return report.model_copy(update={"collectives": [
        *report.collectives, *router_gradient_reductions(model, ns.tp)]})
