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

from typing import Any

import torch

from ..errors import LayoutError
from ..records.memory import MemoryReport, RanksMemory
from .checks import check_call
from .layout import Layout
from .per_rank import Builder, built_model
from .parallelize import parallelize


def memory_ranks(model: torch.nn.Module | Builder, args: Any = (), kwargs: dict | None = None,
                 *, layout: Layout, rank: int | None = None, mode: str = "train",
                 optimizer: str = "adamw", allocator: str = "exact",
                 optimizer_options: dict | None = None, loss=None
                 ) -> MemoryReport | RanksMemory:
    """The `MemoryReport` of rank ``rank`` of ``model`` split by ``layout`` (``fsdp`` and
    ``tp``); without ``rank``, every rank's, naming the rank with the highest peak. ``model``,
    ``args``, ``kwargs``: as `analyze_ranks` takes them; the other options as
    `exportflops.memory` takes them."""
    from ..footprint import check_options

    _check_layout(layout, rank)
    check_options(getattr(model, "__name__", type(model).__name__), mode, optimizer, allocator)
    options = dict(mode=mode, optimizer=optimizer, allocator=allocator,
                   optimizer_options=optimizer_options, loss=loss)
    if rank is not None:
        return _rank(model, args, kwargs, layout, rank, **options)
    reports = [_rank(model, args, kwargs, layout, r, **options)
               for r in range(layout.world_size)]
    highest = max(reports, key=lambda report: report.peak_bytes)  # the first of equal peaks
    return RanksMemory(layout=str(layout), ranks=reports, peak_rank=highest.rank,
                       peak_bytes=highest.peak_bytes)


def _rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None, layout: Layout,
          rank: int, *, mode: str, optimizer: str, allocator: str,
          optimizer_options: dict | None, loss) -> MemoryReport:
    from ..count.ranks import fake_copy
    from ..footprint import ALLOCATORS, default_loss, run_fake
    from ..footprint.report import memory_report

    dims = tuple(name for name in ("fsdp", "tp") if getattr(layout, name) > 1)
    with layout.mesh(*dims, rank=rank) as mesh:
        built, args, kwargs = built_model(model, args, kwargs)
        name = type(built).__name__
        fake_model, fake_args, fake_kwargs = fake_copy(built, args, dict(kwargs or {}))
        parallelize(fake_model, mesh)
        train = mode == "train"
        run = run_fake(fake_model, fake_args, fake_kwargs, name=name, train=train,
                       optimizer=optimizer, optimizer_options=optimizer_options,
                       loss=loss or default_loss(name),
                       resized=(lambda: unsharded_storages(fake_model))
                       if layout.fsdp > 1 else None)
    report = memory_report(run, built, mode=mode, optimizer=optimizer if train else "",
                           allocator=allocator, size=ALLOCATORS[allocator])
    return report.model_copy(update={"world_size": layout.world_size, "rank": rank})


def unsharded_storages(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors on FSDP2's all-gather outputs of ``model`` (each parameter's unsharded
    storage, which FSDP2 allocates and frees by resizing it in place: ``alloc_storage`` and
    ``free_storage`` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py); none without
    FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    tensors = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            for fsdp_param in (group.fsdp_params if group is not None else ()):
                tensors.extend(fsdp_param.all_gather_outputs)
    return tensors


def _check_layout(layout: Layout, rank: int | None) -> None:
    """The checks of every per-rank analysis (`check_call`), then the splits a step's memory is
    modelled for."""
    check_call(layout, rank=rank)
    others = {name: getattr(layout, name) for name in ("pp", "dp", "cp", "ep")
              if getattr(layout, name) > 1}
    if others:
        raise LayoutError(f"{layout}: memory_ranks runs the step of a rank of tensor "
                          f"parallelism and FSDP2 (Layout(fsdp=F, tp=T)); "
                          f"{', '.join(others)} are not modelled yet.")
