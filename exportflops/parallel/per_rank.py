"""One Python entry point for a model split over ranks: `analyze_ranks` on a `Layout`.

A rank of tensor parallelism and FSDP2 (``Layout(fsdp=F, tp=T)``) is counted as torchtitan runs
it: under a fake process group standing for the rank (`exportflops.fake_process_group`), the
layout's mesh built (`Layout.mesh`), a copy of the model split on it (`parallelize`: the plan
on ``tp``, FSDP2 on ``fsdp``) and analyzed (`exportflops.analyze` captures the rank through
``capture.dtensor``/``capture.fsdp``). The caller's model is left as it was: a model on meta is
copied (nothing is allocated), any other onto fake tensors, and so is one FSDP2 shards (FSDP2
refuses meta parameters).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ..errors import InputError, LayoutError
from ..records import Report
from .layout import Layout
from .parallelize import parallelize
from ..count.ranks import fake_copy

#: A model given as a function of the device to build it on: (model, args, kwargs).
Builder = Callable[[torch.device], tuple]


def analyze_ranks(model: torch.nn.Module | Builder, args: Any = (), kwargs: dict | None = None,
                  *, layout: Layout, mode: str = "forward", rank: int | None = None,
                  schedule: str | None = None, microbatches: int | None = None,
                  routing: list[int] | None = None, **analyze_options: Any
                  ) -> Report | list[Report]:
    """Rank ``rank`` of ``model`` split by ``layout``: its `Report` (its local shards' work and
    every collective it issues); without ``rank``, every rank's, in rank order (each counted).

    ``model`` is a module with its example ``args``/``kwargs``, or a function ``device ->
    (model, args, kwargs)`` for a model that must be built for each rank (it is called with
    the meta device inside the rank's process group). ``analyze_options`` go to
    `exportflops.analyze` (``strict``, ``split_backward``). This milestone splits by
    ``fsdp`` and ``tp``; ``pp``, ``ep`` and ``cp`` go through `analyze_pipeline`,
    `analyze_experts` and `analyze_context` (``schedule``, ``microbatches`` and ``routing``
    are theirs)."""
    _check_layout(layout, schedule, microbatches, routing)
    if rank is not None:
        layout.check_rank(rank)
        return rank_of(model, args, kwargs, layout, rank=rank, mode=mode,
                       **analyze_options)[1]
    return [rank_of(model, args, kwargs, layout, rank=r, mode=mode, **analyze_options)[1]
            for r in range(layout.world_size)]


def rank_of(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None, layout: Layout,
            *, rank: int, dims: tuple[str, ...] | None = None, fake: bool = False,
            experts: str | None = None,
            shard: Callable[[torch.nn.Module, Any], None] | None = None,
            inputs: Callable[[tuple, dict | None], tuple] | None = None,
            **analyze_options: Any) -> tuple[torch.nn.Module, Report]:
    """(the model as ``rank`` holds it, its report) on ``layout``'s mesh of ``dims`` (default:
    ``fsdp`` and ``tp`` where split; ``rank`` is a rank of those dimensions). ``fake``: copied
    onto fake cpu tensors even without FSDP2 (on meta, attention is traced as its math
    decomposition; on cpu as one kernel call, as ring attention needs). ``experts``, ``shard``:
    as `parallelize` takes them; ``inputs(args, kwargs)`` gives the inputs to count instead."""
    from ..api import analyze  # api counts every rank with .ranks, which imports this package

    if dims is None:
        dims = tuple(name for name in ("fsdp", "tp") if getattr(layout, name) > 1)
    with layout.mesh(*dims, rank=rank) as mesh:
        built, args, kwargs = _built(model, args, kwargs)
        if inputs is not None:
            args, kwargs = inputs(args, kwargs)
        if fake or "fsdp" in dims or not _on_meta(built):
            built, args, kwargs = fake_copy(built, args, kwargs or {})
        elif built is model:  # the caller's model, on meta: copied, nothing allocated
            built = copy.deepcopy(built)
        parallelize(built, mesh, experts=experts, shard=shard)
        return built, analyze(built, args, kwargs, **analyze_options)


def _built(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None) -> tuple:
    """(model, args, kwargs): ``model`` itself, or what the builder makes on meta."""
    if isinstance(model, torch.nn.Module):
        return model, args if isinstance(args, tuple) else (args,), kwargs
    if not callable(model):
        raise InputError(f"analyze_ranks takes a torch.nn.Module or a function device -> "
                         f"(model, args, kwargs), got {type(model).__name__}.")
    built = model(torch.device("meta"))
    if not (isinstance(built, tuple) and len(built) == 3
            and isinstance(built[0], torch.nn.Module)):
        raise InputError(f"analyze_ranks' model function must return (model, args, kwargs), "
                         f"got {type(built).__name__}.")
    return built


def _on_meta(model: torch.nn.Module) -> bool:
    return all(p.device.type == "meta" for p in [*model.parameters(), *model.buffers()])


def _check_layout(layout: Layout, schedule: str | None, microbatches: int | None,
                  routing: list[int] | None) -> None:
    """The layout splits by fsdp and tp only (this milestone), and by something."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"analyze_ranks takes layout=exportflops.parallel.Layout(...), got "
                         f"{type(layout).__name__}.")
    others = [name for name in ("pp", "dp", "cp", "ep") if getattr(layout, name) > 1]
    if others:
        raise LayoutError(f"{layout}: analyze_ranks splits by fsdp and tp; for "
                         f"{', '.join(others)} use exportflops.parallel.pipeline."
                         f"analyze_pipeline, .experts.analyze_experts or .context."
                         f"analyze_context.")
    given = [name for name, value in (("schedule", schedule), ("microbatches", microbatches),
                                      ("routing", routing)) if value is not None]
    if given:
        raise LayoutError(f"{layout}: {', '.join(given)} lay out a pipeline or route experts: "
                         f"pass them with pp or ep.")
    if layout.world_size == 1:
        raise LayoutError(f"{layout} splits nothing: pass a degree > 1 (Layout(tp=2)), or "
                         f"count the model on one device with exportflops.analyze.")
