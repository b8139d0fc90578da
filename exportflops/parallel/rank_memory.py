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

from ..checkpointing import Blocks, wrap_plan
from ..errors import LayoutError
from ..records.memory import MemoryReport, RanksMemory
from .checks import DEFAULT_SCHEDULE, check_call
from .layout import Layout
from .per_rank import Builder, built_model
from .parallelize import parallelize

if TYPE_CHECKING:
    from ..records.fit import FitPlan


def memory_ranks(model: torch.nn.Module | Builder, args: Any = (), kwargs: dict | None = None,
                 *, layout: Layout, rank: int | None = None, mode: str = "train",
                 optimizer: str = "adamw", allocator: str = "exact",
                 optimizer_options: dict | None = None, loss=None,
                 schedule: str | None = None, microbatches: int | None = None,
                 routing: list[int] | None = None, experts: str = "experts",
                 checkpoint: Blocks | FitPlan | None = None) -> MemoryReport | RanksMemory:
    """The `MemoryReport` of rank ``rank`` of ``model`` split by ``layout`` (``fsdp`` and
    ``tp``, ``pp`` pipeline ranks, each stage on ``fsdp x tp`` ranks:
    `exportflops.parallel.pipeline.composed_memory`, or a ring of ``cp`` context-parallel ranks:
    `exportflops.parallel.context.memory`, or ``Layout(dp=E, ep=E)`` expert-parallel ranks:
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
    from ..count.ranks import fake_copy
    from ..footprint import ALLOCATORS, default_loss, run_fake
    from ..footprint.report import memory_report

    dims = tuple(name for name in ("fsdp", "tp") if getattr(layout, name) > 1)
    with layout.mesh(*dims, rank=rank) as mesh:
        built, args, kwargs = built_model(model, args, kwargs)
        name = type(built).__name__
        fake_model, fake_args, fake_kwargs = fake_copy(built, args, dict(kwargs or {}))
        parallelize(fake_model, mesh, checkpoint=functools.partial(
            wrap_plan, plan=checkpoint, name=name) if checkpoint is not None else None)
        train = mode == "train"
        run = run_fake(fake_model, fake_args, fake_kwargs, name=name, train=train,
                       optimizer=optimizer, optimizer_options=optimizer_options,
                       loss=loss or default_loss(name),
                       resized=(lambda: unsharded_storages(fake_model))
                       if layout.fsdp > 1 else None)
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
    return context_rank_memory(built, args, kwargs, cp=layout.cp, rank=rank, **options)


def _expert_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                 layout: Layout, rank: int, **options) -> MemoryReport:
    from .experts.memory import expert_rank_memory

    built, args, kwargs = built_model(model, args, kwargs)
    return expert_rank_memory(built, args, kwargs, ep=layout.ep, rank=rank,
                              world_size=layout.world_size, **options)


def unsharded_storages(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors on FSDP2's all-gather outputs of ``model`` (each parameter's unsharded
    storage, which FSDP2 allocates and frees by resizing it in place: ``alloc_storage`` and
    ``free_storage`` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py); none without
    FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    from ..torch_internals import fsdp_all_gather_outputs

    return [tensor for module in model.modules() if isinstance(module, FSDPModule)
            for tensor in fsdp_all_gather_outputs(module)]


def _check_layout(layout: Layout, rank: int | None, **options: Any) -> None:
    """The checks of every per-rank analysis (`check_call`), then the splits a step's memory is
    modelled for."""
    check_call(layout, rank=rank, **options)
    alone = next((name for name in ("pp", "cp", "ep") if getattr(layout, name) > 1), None)
    composes = ("fsdp", "tp") if alone == "pp" else ()  # a pipeline's stages on (fsdp, tp)
    others = {name: getattr(layout, name) for name in ("fsdp", "tp", "pp", "cp", "ep")
              if alone and name != alone and name not in composes and getattr(layout, name) > 1}
    if layout.dp > 1 and alone != "ep":  # expert groups sit in the dp ranks: Layout(dp=E, ep=E)
        others["dp"] = layout.dp
    if others:
        raise LayoutError(f"{layout}: memory_ranks runs the step of a rank of tensor "
                          f"parallelism and FSDP2 (Layout(fsdp=F, tp=T)), of a pipeline "
                          f"(Layout(pp=P), its stages on Layout(fsdp=F, tp=T) ranks), of "
                          f"a context-parallel ring (Layout(cp=C)) or of expert "
                          f"parallelism (Layout(dp=E, ep=E)); "
                          f"{', '.join(others)} {f'with {alone} ' if alone else ''}"
                          f"are not modelled yet.")
