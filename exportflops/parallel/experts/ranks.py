"""Expert parallelism on a `Layout`: ``ep`` alone (``Layout(dp=E, ep=E)``), inside FSDP2
(``fsdp``), over the tensor-parallel ranks (``tp``) or both, as torchtitan lays them out
(`exportflops.parallel.layout`).

The record is `expert_parallel`'s from the single-device count of one batch, checked first (the
tensor-parallel rank's count and the FSDP2 trace are the costly parts); inside FSDP2 it adds
FSDP2's collectives traced on a fake copy (`exportflops.parallel.experts.fsdp`); over ``tp``,
each rank's work is its tensor-parallel rank's with each MoE layer routing its share of the
tokens (`exportflops.parallel.experts.tp`), and in training the routers' gradient all-reduces.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch

from ...aggregate import Counted, build_report
from ...api import count_call
from ...errors import InputError, LayoutError
from ...records import Report
from ...records.experts import ExpertParallelReport
from .analysis import expert_parallel, moe_sizes
from .fsdp import fsdp_collectives
from .tp import router_gradient_reductions
from ..layout import Layout
from ..parallelize import tensor_parallel
from ..per_rank import Builder, built_model, counted_rank_of


def analyze_expert_ranks(model: torch.nn.Module | Builder, args: Any = (),
                         kwargs: dict | None = None, *, layout: Layout, mode: str = "forward",
                         routing: list[int] | None = None, experts: str = "experts",
                         single_device: Report | None = None, **analyze_options: Any,
                         ) -> tuple[ExpertParallelReport, Counted | None]:
    """(the `ExpertParallelReport` of every rank of ``layout``, the count each rank's report is
    built from by `expert_rank_report`: the batch's single-device count, with ``tp`` its
    tensor-parallel rank's). ``model`` as `analyze_ranks` takes it; ``single_device``: the
    batch's report when made already (else counted here with ``analyze_options``; given
    without ``tp``, no count is made here and the second is None); ``routing`` and
    ``experts`` as `analyze_experts` takes them."""
    built, args, kwargs = built_model(model, args, kwargs)
    fsdp, tp = (getattr(layout, name) if getattr(layout, name) > 1 else None
                for name in ("fsdp", "tp"))
    if layout.pp > 1 or layout.cp > 1 or layout.ep == 1:
        raise LayoutError(f"{layout}: expert parallelism takes ep > 1 with fsdp and tp, not "
                          f"with pp or cp.")
    counted = None
    if single_device is None:
        counted = count_call(built, args, kwargs, mode=mode, **analyze_options)
        single_device = build_report(counted)
    sizes = moe_sizes(built, args, kwargs, experts=experts)
    split = {"fsdp": fsdp, **({"tp": tp, "single_device": single_device} if tp else {})}
    record = expert_parallel(single_device, ep=layout.ep, routing=routing, experts=experts,
                             **split, **sizes)
    report = single_device
    if fsdp is not None:
        split["fsdp_collectives"] = fsdp_collectives(
            built, args, kwargs, ep=layout.ep, fsdp=fsdp, num_experts=sizes["num_experts"],
            experts=experts, mode=mode, tp=tp,
            parallelize=None if tp is None else partial(tensor_parallel, experts=experts))
    if tp is not None:
        counted = _tensor_parallel_rank(model, args, kwargs, tp, mode, experts, analyze_options)
        report = build_report(counted)
    if fsdp is not None or tp is not None:
        record = expert_parallel(report, ep=layout.ep, routing=routing, experts=experts,
                                 **split, **sizes)
    return record, counted


def expert_rank_report(record: ExpertParallelReport, counted: Counted | None,
                       rank: int) -> Report:
    """Rank ``rank``'s report: ``counted`` (`analyze_expert_ranks`') built with the world and
    the collectives the rank issues; its own counts under the routing are the record's."""
    if not 0 <= rank < record.world_size():
        raise LayoutError(f"rank {rank}: the expert-parallel layout of {record.model} has ranks "
                          f"0..{record.world_size() - 1}.")
    if counted is None:
        raise InputError(f"rank {rank}'s report of {record.model} is built from the count "
                         f"analyze_expert_ranks makes, and it was given single_device= (a "
                         f"finished report) instead: leave single_device out to have the "
                         f"rank's report.")
    return build_report(dataclasses.replace(counted, world_size=record.world_size(), rank=rank,
                                            collectives=record.collectives(rank)))


def _tensor_parallel_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                          tp: int, mode: str, experts: str, options: dict) -> Counted:
    """Tensor-parallel rank 0's count with each MoE layer routing its share of the tokens, its
    routers' gradient all-reduces listed in training. FSDP2 changes no FLOPs: one rank of the
    tp group alone counts the work."""
    split, counted = counted_rank_of(model, args, kwargs, Layout(tp=tp), rank=0,
                                     experts=experts, mode=mode, **options)
    if mode == "train":
        counted = dataclasses.replace(counted, collectives=[
            *counted.collectives, *router_gradient_reductions(split, tp, experts=experts)])
    return counted
