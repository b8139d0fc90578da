"""The memory of one step per rank of tensor parallelism and FSDP2 (`memory_ranks`), as
`analyze_ranks` counts its FLOPs: under a fake process group standing for the rank, the
layout's mesh built, a fake copy of the model split on it (`parallelize`), and the step of
`exportflops.memory` run on that copy. What the rank holds is what torch allocates for it: the
parameters' local shards (a DTensor's storage is its shard's), their gradients and optimizer
states, the rank's activations, FSDP2's all-gather outputs, the unsharded parameters of the
blocks in flight (FSDP2 resizes their storage in place: followed op by op), and its
reduce-scatter buffers. Collectives move no data under the fake process group, but every output
they write is allocated as on a real rank: a functional collective's by its fake kernel, FSDP2's
by the ``torch.empty`` it passes to c10d.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from ..checkpointing import Blocks
from ..errors import LayoutError
from ..records.memory import MemoryReport, RanksMemory
from .checks import DEFAULT_SCHEDULE, check_call
from .layout import Layout
from .per_rank import Builder, built_model
from .rank_step import split_step

if TYPE_CHECKING:
    from ..records.fit import FitPlan

#: The splits each family's step composes with: a pipeline's stages, a ring's ranks and an expert
#: group's are split by tp and fsdp as `analyze_ranks` splits them
#: (`exportflops.parallel.pipeline.composed_memory`, `exportflops.parallel.context.memory`,
#: `exportflops.parallel.experts.memory`).
_COMPOSED = {"pp": ("fsdp", "tp"), "cp": ("fsdp", "tp"), "ep": ("fsdp", "tp")}


def memory_ranks(model: torch.nn.Module | Builder, args: Any = (), kwargs: dict | None = None,
                 *, layout: Layout, rank: int | None = None, mode: str = "train",
                 optimizer: str = "adamw", allocator: str = "exact",
                 optimizer_options: dict | None = None, loss=None,
                 schedule: str | None = None, microbatches: int | None = None,
                 routing: list[int] | None = None, experts: str = "experts",
                 checkpoint: Blocks | FitPlan | None = None) -> MemoryReport | RanksMemory:
    """The `MemoryReport` of rank ``rank`` of ``model`` split by ``layout`` (``fsdp`` and
    ``tp``, ``pp`` pipeline ranks, each stage on ``fsdp x tp`` ranks:
    `exportflops.parallel.pipeline.composed_memory`, or rings of ``cp`` ranks, with ``fsdp``
    and ``tp`` too: `exportflops.parallel.context.memory`, or expert-parallel ranks, alone,
    over tp or inside fsdp (``Layout(dp=E, ep=E)``, ``Layout(fsdp=F, tp=T, ep=E)``):
    `exportflops.parallel.experts.memory`, ``routing`` and ``experts`` as `analyze_ranks`
    takes them); without ``rank``, every rank's, naming the rank with the
    highest peak. ``model``, ``args``, ``kwargs``: as `analyze_ranks` takes them (with ``pp``,
    ``args`` is one microbatch, and a step runs ``microbatches``, default ``pp``, under
    ``schedule``: `exportflops.parallel.pipeline.stage_memory`); ``checkpoint``: a `FitPlan`
    or `exportflops.checkpointing.Blocks`, its blocks checkpointed on each rank's copy as
    torchtitan orders it: between tensor parallelism and FSDP2 (`parallelize`), after the
    experts are sharded, on each pipeline stage the blocks it holds (every block in one stage);
    the other options as `exportflops.memory` takes them."""
    from ..footprint import check_options

    _check_layout(layout, rank, schedule=schedule, microbatches=microbatches, routing=routing)
    check_options(getattr(model, "__name__", type(model).__name__), mode, optimizer, allocator)
    options = dict(mode=mode, optimizer=optimizer, allocator=allocator,
                   optimizer_options=optimizer_options, loss=loss, checkpoint=checkpoint)
    one_rank = _rank
    if layout.pp > 1:
        one_rank = functools.partial(_pipeline_rank, schedule=schedule or DEFAULT_SCHEDULE,
                                     microbatches=microbatches)
    elif layout.cp > 1:
        one_rank = _context_rank
    elif layout.ep > 1:
        one_rank = functools.partial(_expert_rank, routing=routing, experts=experts)
    if rank is not None:
        return one_rank(model, args, kwargs, layout, rank, **options)
    reports = [one_rank(model, args, kwargs, layout, r, **options)
               for r in range(layout.world_size)]
    highest = max(reports, key=lambda report: report.peak_bytes)  # the first of equal peaks
    return RanksMemory(layout=str(layout), ranks=reports, peak_rank=highest.rank,
                       peak_bytes=highest.peak_bytes)


def _rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None, layout: Layout,
          rank: int, *, mode: str, optimizer: str, allocator: str,
          optimizer_options: dict | None, loss, checkpoint: Blocks | FitPlan | None
          ) -> MemoryReport:
    from ..footprint import ALLOCATORS
    from ..footprint.report import memory_report

    built, args, kwargs = built_model(model, args, kwargs)
    train = mode == "train"
    run = split_step(built, args, kwargs, layout, rank, train=train, optimizer=optimizer,
                     optimizer_options=optimizer_options, loss=loss, checkpoint=checkpoint)
    return memory_report(run, built, mode=mode, optimizer=optimizer if train else "",
                         allocator=allocator, size=ALLOCATORS[allocator],
                         world_size=layout.world_size, rank=rank)


def _pipeline_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                   layout: Layout, rank: int, **options) -> MemoryReport:
    from .pipeline.composed_memory import composed_pipeline_memory
    from .pipeline.stage_memory import pipeline_memory

    composed = layout.fsdp > 1 or layout.tp > 1  # stages of the model's own modules
    return (composed_pipeline_memory if composed else pipeline_memory)(
        model, args, kwargs, layout=layout, rank=rank, **options)


def _context_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                  layout: Layout, rank: int, **options) -> MemoryReport:
    from .context.memory import context_rank_memory

    built, args, kwargs = built_model(model, args, kwargs)
    return context_rank_memory(built, args, kwargs, layout=layout, rank=rank, **options)


def _expert_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                 layout: Layout, rank: int, **options) -> MemoryReport:
    from .experts.memory import expert_rank_memory

    built, args, kwargs = built_model(model, args, kwargs)
    return expert_rank_memory(built, args, kwargs, layout=layout, rank=rank, **options)


def _check_layout(layout: Layout, rank: int | None, **options: Any) -> None:
    """The checks of every per-rank analysis (`check_call`), then the splits a step's memory is
    modelled for."""
    check_call(layout, rank=rank, **options)
    alone = next((name for name in ("pp", "cp", "ep") if getattr(layout, name) > 1), None)
    composed = (alone, *_COMPOSED.get(alone, ()))
    others = {name: getattr(layout, name) for name in ("fsdp", "tp", "pp", "cp", "ep")
              if alone and name not in composed and getattr(layout, name) > 1}
    # expert groups sit in the dp ranks (Layout(dp=E, ep=E)), or beside the tp groups' replicas
    if layout.dp > 1 and (alone != "ep" or layout.fsdp > 1):
        others["dp"] = layout.dp
    if others:
        raise LayoutError(f"{layout}: memory_ranks runs the step of a rank of tensor "
                          f"parallelism and FSDP2 (Layout(fsdp=F, tp=T)), of a pipeline "
                          f"(Layout(pp=P), its stages on Layout(fsdp=F, tp=T) ranks), of a "
                          f"context-parallel ring inside FSDP2 and over tensor parallelism "
                          f"(Layout(fsdp=F, cp=C, tp=T)) or of expert parallelism alone, over "
                          f"tp or inside FSDP2 (Layout(dp=E, ep=E), Layout(tp=T, ep=T), "
                          f"Layout(fsdp=F, tp=T, ep=E)); "
                          f"{', '.join(others)} {f'with {alone} ' if alone else ''}"
                          f"are not modelled yet.")
