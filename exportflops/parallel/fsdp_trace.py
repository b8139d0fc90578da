"""FSDP2's all-gathers and reduce-scatters of one rank, traced from real FSDP2 on a fake copy of
a model under a fake process group: shared by expert parallelism inside FSDP2
(`exportflops.parallel.experts.fsdp`) and context parallelism inside FSDP2
(`exportflops.parallel.context`).

A copy of the model on fake tensors (nothing allocated; the caller's model is untouched), its
parameters optionally resized to one rank's local shard, gets ``fully_shard`` as torchtitan's
``apply_fsdp`` applies it: inner units first (the caller's), then each block (`blocks_of`), then
the root, over all ``world`` ranks; it is analyzed (`exportflops.analyze` traces FSDP2 through
``capture.fsdp``) and only its collectives are kept. Every rank issues collectives of the same
sizes (a collective's ranks pass equal sizes, and every rank's groups and local shapes are
alike), so rank 0's trace stands for each rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..count.ranks import fake_copy
from ..errors import DistributedError, InputError
from ..records import Collective
from .fsdp_blocks import blocks_of
from .layout import Layout

#: The dimension of the mesh FSDP2 shards over, which its collectives carry: torchtitan's name
#: for the flattened data-parallel shard ranks (``dp_shard x cp``, ``ParallelDims``).
FSDP_DIM = "fsdp"


def traced_fsdp_collectives(model: torch.nn.Module, args: tuple = (),
                            kwargs: dict | None = None, *, world: int, mode: str = "forward",
                            local_shape: Callable[[torch.nn.Parameter], tuple] | None = None,
                            shard_inner: Callable[[torch.nn.Module], None] | None = None,
                            units: str = "blocks and root", tp: int | None = None,
                            parallelize: Callable[[torch.nn.Module, Any], None] | None = None,
                            ) -> list[Collective]:
    """FSDP2's collectives of rank 0 of ``world`` ranks sharding ``model``, in the order the rank
    issues them (the module docstring). ``local_shape`` gives a parameter's shape on the rank
    (default its own); ``shard_inner`` shards inner units of the fake copy first, inside the
    fake process group (it may build its own meshes). The collectives over all ``world`` ranks
    carry ``mesh_dim`` ``fsdp``; ``units`` names what is sharded, for the error message. With
    ``tp``, the world is the mesh (fsdp, tp), tp innermost, ``parallelize(copy, tp mesh)``
    applies the tensor-parallel layout before FSDP2 shards over the ``fsdp`` ranks of the rank's
    tp index, and the trace's tensor-parallel collectives are left out."""
    from torch.distributed.fsdp import fully_shard

    from ..api import count_call

    if (tp or 1) > 1 and parallelize is None or parallelize is not None and tp is None:
        raise InputError(f"{type(model).__name__}: tp={tp} and parallelize go together: the "
                         f"tensor-parallel layout parallelize applies on the tp mesh is what "
                         f"FSDP2 shards; pass both, or neither.")
    layout = Layout(fsdp=world // (tp or 1), tp=tp or 1)
    with layout.mesh(FSDP_DIM, *(["tp"] if tp else [])) as mesh:
        dense = mesh[FSDP_DIM] if tp else mesh
        fake, fake_args, fake_kwargs = fake_copy(model, args, kwargs or {}, local_shape)
        if parallelize is not None:
            parallelize(fake, mesh["tp"])
        if hasattr(fake, "set_experts_implementation"):
            # transformers' default grouped_mm experts do not run on fake cpu tensors (torch's
            # meta kernel of grouped_mm takes bfloat16 only), its eager ones branch on the
            # routing's values; batched_mm gathers each copy's expert weights with no branch.
            # The copy's FLOPs are not kept, so how its experts compute changes nothing here.
            fake.set_experts_implementation("batched_mm")
        try:
            if shard_inner is not None:
                shard_inner(fake)
            for block in blocks_of(fake):
                fully_shard(block, mesh=dense)
            fully_shard(fake, mesh=dense)
        except Exception as error:  # FSDP2 refuses the model as built; torch raises many types
            raise DistributedError(
                f"fully_shard of {type(model).__name__}'s {units} over {world} ranks failed: "
                f"{type(error).__name__}: {error}") from error
        with warnings.catch_warnings():
            # FSDP2 warns of a unit returning a view (an in-place op on it would skip a hook):
            # advice to the model's author, which changes no collective traced here.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
            # The collectives alone are kept: the count, not built into a report.
            counted = count_call(fake, fake_args, fake_kwargs, mode=mode)
    return [c for c in counted.collectives if not tp or c.mesh_dim != "tp"]
