"""The step of one rank of tensor parallelism and FSDP2 on a fake copy of the model (`split_step`),
which every per-rank memory runs on its rank's group (`exportflops.parallel.rank_memory`, a ring
rank's in `exportflops.parallel.context.memory`): under a fake process group standing for the
rank, the mesh built, the copy split on it (`parallelize`) and the step of `exportflops.memory`
run, FSDP2's unsharded storages followed as it resizes them (`unsharded_storages`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import torch

from ..checkpointing import Blocks, wrap_plan
from .layout import Layout
from .parallelize import parallelize

if TYPE_CHECKING:
    from ..footprint.step import StepRun
    from ..records.fit import FitPlan


def split_step(built: torch.nn.Module, args: tuple, kwargs: dict | None, layout: Layout,
               rank: int, *, train: bool, optimizer: str, optimizer_options: dict | None, loss,
               checkpoint: Blocks | FitPlan | None) -> StepRun:
    """The step of rank ``rank`` of ``layout``'s mesh of ``fsdp`` and ``tp`` (a rank of those
    dimensions) on a fake copy of ``built`` split on it (`parallelize`, ``checkpoint``'s
    blocks wrapped between tensor parallelism and FSDP2); without either, one device's step
    on the copy."""
    from ..count.ranks import fake_copy
    from ..footprint import default_loss, run_fake

    name = type(built).__name__
    dims = tuple(dim for dim in ("fsdp", "tp") if getattr(layout, dim) > 1)
    wrap = functools.partial(wrap_plan, plan=checkpoint, name=name) \
        if checkpoint is not None else None
    with layout.mesh(*dims, rank=rank) if dims else contextlib.nullcontext() as mesh:
        fake_model, fake_args, fake_kwargs = fake_copy(built, args, dict(kwargs or {}))
        if mesh is not None:
            parallelize(fake_model, mesh, checkpoint=wrap)
        elif wrap is not None:
            wrap(fake_model)
        return run_fake(fake_model, fake_args, fake_kwargs, name=name, train=train,
                        optimizer=optimizer, optimizer_options=optimizer_options,
                        loss=loss or default_loss(name),
                        resized=(lambda: unsharded_storages(fake_model))
                        if layout.fsdp > 1 else None)


def unsharded_storages(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors on FSDP2's all-gather outputs of ``model`` (each parameter's unsharded
    storage, which FSDP2 allocates and frees by resizing it in place: ``alloc_storage`` and
    ``free_storage`` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py); none without
    FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    from ..torch_internals import fsdp_all_gather_outputs

    return [tensor for module in model.modules() if isinstance(module, FSDPModule)
            for tensor in fsdp_all_gather_outputs(module)]
