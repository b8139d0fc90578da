"""One Python entry point for a model split over ranks: `analyze_ranks` on a `Layout`, the
record the command prints for the layout (or one rank's report of it).

Tensor parallelism and FSDP2 count the rank asked (`exportflops.parallel.per_rank`); expert
parallelism, alone, inside FSDP2 or over tp, every rank from the single-device count
(`exportflops.parallel.experts.ranks`); context parallelism, alone or with fsdp and tp, every
rank from the symbolic count (`exportflops.parallel.context.ranks`); a pipeline, each stage
on fsdp x tp ranks, every stage's rank counted once (`exportflops.parallel.pipeline.ranks`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import analyze
from ..records import Report
from ..records.context import ContextParallelReport
from ..records.experts import ExpertParallelReport
from ..records.pipeline import PipelineReport
from .checks import check_call
from .context.ranks import analyze_context_ranks, context_rank_report
from .experts.ranks import analyze_expert_ranks, expert_rank_report
from .layout import Layout
from .per_rank import Builder, built_model, rank_of
from .pipeline.ranks import analyze_pipeline_ranks
from .pipeline.mesh import rank_report


def analyze_ranks(model: torch.nn.Module | Builder, args: Any = (), kwargs: dict | None = None,
                  *, layout: Layout, mode: str = "forward", rank: int | None = None,
                  schedule: str | None = None, microbatches: int | None = None,
                  routing: list[int] | None = None, **analyze_options: Any
                  ) -> (Report | list[Report] | PipelineReport | ExpertParallelReport
                        | ContextParallelReport):
    """Rank ``rank`` of ``model`` split by ``layout``: its `Report` (its work and every
    collective it issues); without ``rank``, the all-ranks view: with ``pp``, the
    `PipelineReport` (each stage on fsdp x tp ranks; ``schedule``, ``microbatches`` and
    `analyze_pipeline_ranks`' options such as ``device``); with ``cp``, the
    `ContextParallelReport` (``load_balance`` in ``analyze_options``, as `analyze_context`
    takes it); with ``ep``, the `ExpertParallelReport` (``routing``: token copies per expert,
    as `analyze_experts` takes it); with ``fsdp`` and ``tp`` alone, every rank's report, in
    rank order (each counted).

    ``model`` is a module with its example ``args``/``kwargs``, or a function ``device ->
    (model, args, kwargs)`` for a model that must be built for each rank (it is called with
    the meta device inside the rank's process group). ``analyze_options`` go to
    `exportflops.analyze` (``strict``, ``split_backward``)."""
    check_call(layout, rank=rank, schedule=schedule, microbatches=microbatches,
               routing=routing, load_balance=analyze_options.get("load_balance", True))
    if layout.pp > 1:
        analysis = analyze_pipeline_ranks(model, args, kwargs, layout=layout, mode=mode,
                                          schedule=schedule, microbatches=microbatches,
                                          **analyze_options)
        return analysis.record if rank is None else rank_report(analysis, rank)
    if layout.cp > 1:
        record, fpb = analyze_context_ranks(model, args, kwargs, layout=layout, mode=mode,
                                            rank=rank or 0, **analyze_options)
        return record if rank is None else context_rank_report(record, fpb, rank)
    if layout.ep > 1:
        record, counted = analyze_expert_ranks(model, args, kwargs, layout=layout, mode=mode,
                                               routing=routing, **analyze_options)
        return record if rank is None else expert_rank_report(record, counted, rank)
    if layout.world_size == 1:  # one rank holds the whole model: the single-device count
        built, args, kwargs = built_model(model, args, kwargs)
        report = analyze(built, args, kwargs, mode=mode, **analyze_options)
        return report if rank is not None else [report]
    if rank is not None:
        return rank_of(model, args, kwargs, layout, rank=rank, mode=mode,
                       **analyze_options)[1]
    return [rank_of(model, args, kwargs, layout, rank=r, mode=mode, **analyze_options)[1]
            for r in range(layout.world_size)]

