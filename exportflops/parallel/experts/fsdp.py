"""Expert parallelism inside FSDP2, as torchtitan lays it out: the all-gathers and reduce-scatters
FSDP2 adds to each rank, traced from real FSDP2 under a fake process group.

The layout (torchtitan/distributed/parallel_dims.py, ``ParallelDims.build_mesh``): the ``fsdp``
data-parallel ranks are unflattened into the sparse mesh (``efsdp``, ``ep``), ``ep`` innermost.
Rank r is rank ``r mod ep`` of the expert-parallel group of ranks ``ep x (r div ep)`` ..
``ep x (r div ep) + ep - 1``, which exchange tokens, and rank ``r div ep`` of its ``efsdp`` group
``r mod ep, r mod ep + ep, ...`` (fsdp / ep ranks), which hold the same experts. ep must divide
fsdp (``ParallelDims._validate``: ep divides dp_shard x cp x tp).

The sharding (torchtitan/distributed/fsdp.py, ``apply_fsdp_to_decoder``): the routed experts'
parameters, already the rank's E / ep experts (``ExpertParallel`` shards them on dim 0 over
``ep``), are sharded over the ``efsdp`` group, on dim 1 when ``efsdp x ep`` exceeds the expert
count (to avoid padding), else dim 0; every other parameter of a block over all ``fsdp`` ranks
(dim 0); then the root. torchtitan issues both in one ``fully_shard`` per block with a
per-parameter mesh; here the experts module is its own unit on the ``efsdp`` mesh inside its
block's unit (torchtitan's layout before the per-parameter mesh): the same parameters in the
same groups, hence the same messages, each all-gather issued when its unit runs
(docs/expert-parallel.md).

How (`exportflops.parallel.fsdp_trace`): a copy of the model on fake tensors (nothing
allocated; the caller's model is untouched) whose experts modules hold one rank's E / ep
experts, sharded that way under a fake process group of ``fsdp`` ranks and analyzed. Only its
collectives are kept: its experts run every routed copy on the local experts' shapes, which is
not expert-parallel work (`exportflops.parallel.experts` counts that). Every rank issues
collectives of the same sizes (a collective's ranks pass equal sizes, and every rank's groups and
local shapes are alike), so rank 0's trace stands for each rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...errors import InputError, LayoutError
from ...records import Collective
from ...records.names import outermost_named
from ..fsdp_trace import traced_fsdp_collectives
from ..layout import Layout


def expert_layout(model: str, ep: int, fsdp: int | None = None, tp: int | None = None) -> Layout:
    """The `Layout` of ``ep``-rank expert-parallel groups inside ``fsdp`` FSDP2 ranks and over
    ``tp`` tensor-parallel ranks (None: not split that way): without either, ``ep``
    data-parallel ranks; its checks' errors name ``model``."""
    try:
        return Layout(dp=ep if fsdp is None and tp is None else 1, fsdp=fsdp or 1, tp=tp or 1,
                      ep=ep)
    except LayoutError as error:
        raise LayoutError(f"{model}: {error}") from error


def fsdp_collectives(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                     ep: int, fsdp: int, num_experts: int, experts: str = "experts",
                     mode: str = "forward", tp: int | None = None,
                     parallelize: Callable[[torch.nn.Module, Any], None] | None = None,
                     ) -> list[Collective]:
    """FSDP2's all-gathers and reduce-scatters of one rank of ``fsdp`` data-parallel ranks with
    ``model``'s experts sharded over ``ep`` of them (the module docstring's layout), in the order
    the rank issues them; ``mesh_dim`` is ``fsdp`` for the non-expert parameters' and ``efsdp``
    for the experts'. ``model`` and its inputs may be on meta: a fake copy is traced. With
    ``tp``, the world is the mesh (fsdp, tp), tp innermost, ``parallelize(copy, tp mesh)``
    applies the tensor-parallel layout first, and the experts' ``efsdp`` groups span fsdp x tp
    / ep ranks (torchtitan's sparse mesh); only FSDP2's collectives are kept."""
    layout = expert_layout(type(model).__name__, ep, fsdp, tp)
    world = layout.world_size
    local = _local_experts(model, experts=experts, ep=ep, num_experts=num_experts)

    def local_shape(p: torch.nn.Parameter) -> tuple:
        return (num_experts // ep, *p.shape[1:]) if id(p) in local else tuple(p.shape)

    def shard_experts(fake: torch.nn.Module) -> None:
        sparse = layout.device_mesh("efsdp", "ep")
        fully_shard_experts(fake, sparse["efsdp"], experts=experts,
                            experts_dim=experts_dim(world, num_experts))

    return traced_fsdp_collectives(
        model, args, kwargs, world=world, mode=mode, local_shape=local_shape,
        shard_inner=shard_experts, tp=tp, parallelize=parallelize,
        units=f"{experts!r} modules on the efsdp mesh ({world // ep} ranks), then its blocks "
              f"and root")


def _local_experts(model: torch.nn.Module, *, experts: str, ep: int,
                   num_experts: int) -> set[int]:
    """The ids of ``model``'s experts modules' parameters, checked to be stacked
    ``(num_experts, ...)`` tensors that ``ep`` ranks hold ``num_experts / ep`` rows of each:
    the local shard torchtitan's ``ExpertParallel`` leaves each rank."""
    holders = [module for path, module in model.named_modules()
               if path.rpartition(".")[2] == experts]
    stacked = [p for module in holders for p in module.parameters()]
    if not stacked or num_experts % ep or any(p.dim() == 0 or p.shape[0] != num_experts
                                              for p in stacked):
        raise InputError(
            f"{type(model).__name__}: expert parallelism inside FSDP2 shards each {experts!r} "
            f"module's parameters on dim 0, the expert dim, over ep {ep} ranks: they must be "
            f"stacked ({num_experts}, ...) tensors (torchtitan's GroupedExperts, transformers "
            f"5's experts) with ep dividing {num_experts}; got shapes "
            f"{sorted({tuple(p.shape) for p in stacked})}.")
    return {id(p) for p in stacked}


def experts_dim(world: int, num_experts: int) -> int:
    """The dim FSDP2 shards the rank's experts on: 1 where the ``efsdp x ep`` ranks (``world``,
    the ranks of a data-parallel place) outnumber the experts, else 0 (module docstring)."""
    return 1 if world > num_experts else 0


def fully_shard_experts(model: torch.nn.Module, efsdp, *, experts: str,
                        experts_dim: int) -> None:
    """Each outermost experts module on ``efsdp`` (dim ``experts_dim``): torchtitan's inner
    units, sharded before the blocks and the root."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    for path in outermost_named((path for path, _ in model.named_modules()), experts):
        fully_shard(model.get_submodule(path), mesh=efsdp,
                    shard_placement_fn=lambda _, dim=experts_dim: Shard(dim))
