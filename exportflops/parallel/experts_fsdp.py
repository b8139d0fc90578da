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

How: a copy of the model on fake tensors (nothing allocated; the caller's model is untouched)
whose experts modules hold one rank's E / ep experts, sharded that way under a fake process group
of ``fsdp`` ranks and analyzed (`exportflops.analyze` traces FSDP2 through ``capture.fsdp``). Only
its collectives are kept: its experts run every routed copy on the local experts' shapes, which is
not expert-parallel work (`exportflops.parallel.experts` counts that). Every rank issues
collectives of the same sizes (a collective's ranks pass equal sizes, and every rank's groups and
local shapes are alike), so rank 0's trace stands for each rank.
"""

from __future__ import annotations

import copy
import warnings

import torch

from ..errors import DistributedError, InputError
from ..records import Collective
from ..torch_internals import FakeTensorMode, pytree
from .fsdp_blocks import blocks_of
from .ranks import fake_process_group


def check_fsdp(model: str, ep: int, fsdp: int) -> None:
    """``fsdp`` ranks can hold ``ep``-rank expert-parallel groups: ints >= 1, ep dividing fsdp."""
    for what, value in (("ep", ep), ("fsdp", fsdp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{model}: {what} must be an int >= 1, got {value!r}.")
    if fsdp % ep:
        raise InputError(f"{model}: fsdp {fsdp} (--fsdp) is not a multiple of ep {ep} (--ep): "
                         f"expert parallelism sits inside FSDP2 as torchtitan lays it out, each "
                         f"group of ep ranks inside the fsdp ranks (ep must divide fsdp); pass "
                         f"an fsdp that is a multiple of ep.")


def fsdp_collectives(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                     ep: int, fsdp: int, num_experts: int, experts: str = "experts",
                     mode: str = "forward") -> list[Collective]:
    """FSDP2's all-gathers and reduce-scatters of one rank of ``fsdp`` data-parallel ranks with
    ``model``'s experts sharded over ``ep`` of them (the module docstring's layout), in the order
    the rank issues them; ``mesh_dim`` is ``fsdp`` for the non-expert parameters' and ``efsdp``
    for the experts'. ``model`` and its inputs may be on meta: a fake copy is traced."""
    name = type(model).__name__
    check_fsdp(name, ep, fsdp)
    from torch.distributed.device_mesh import init_device_mesh

    from ..api import analyze

    with fake_process_group(fsdp, rank=0):
        sparse = init_device_mesh("cpu", (fsdp // ep, ep), mesh_dim_names=("efsdp", "ep"))
        dense = init_device_mesh("cpu", (fsdp,), mesh_dim_names=("fsdp",))
        fake, fake_args, fake_kwargs = _fake_copy(model, args, kwargs or {}, experts=experts,
                                                  ep=ep, num_experts=num_experts)
        _fully_shard(fake, dense, sparse["efsdp"], experts=experts,
                     experts_dim=1 if fsdp > num_experts else 0)
        with warnings.catch_warnings():
            # FSDP2 warns of a unit returning a view (an in-place op on it would skip a hook):
            # advice to the model's author, which changes no collective traced here.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
            report = analyze(fake, fake_args, fake_kwargs, mode=mode)
        # The dense mesh spans the world, whose group torch describes as no mesh dimension.
        world = dense.get_group().group_name
    return [c.model_copy(update={"mesh_dim": "fsdp"}) if c.group == world and not c.mesh_dim
            else c for c in report.collectives]


def _fake_copy(model: torch.nn.Module, args: tuple, kwargs: dict, *, experts: str, ep: int,
               num_experts: int) -> tuple[torch.nn.Module, tuple, dict]:
    """A copy of ``model`` and its inputs on fake cpu tensors of the same shapes and dtypes
    (FSDP2 refuses meta), its experts modules' parameters one rank's ``num_experts / ep``
    experts: the local shard torchtitan's ``ExpertParallel`` leaves each rank."""
    holders = [module for path, module in model.named_modules()
               if path.rpartition(".")[2] == experts]
    local = {id(p) for module in holders for p in module.parameters()}
    stacked = [p for module in holders for p in module.parameters()]
    if not stacked or num_experts % ep or any(p.dim() == 0 or p.shape[0] != num_experts
                                              for p in stacked):
        raise InputError(
            f"{type(model).__name__}: expert parallelism inside FSDP2 shards each {experts!r} "
            f"module's parameters on dim 0, the expert dim, over ep {ep} ranks: they must be "
            f"stacked ({num_experts}, ...) tensors (torchtitan's GroupedExperts, transformers "
            f"5's experts) with ep dividing {num_experts}; got shapes "
            f"{sorted({tuple(p.shape) for p in stacked})}.")
    mode = FakeTensorMode()

    def fake(tensor: torch.Tensor, shape) -> torch.Tensor:
        with mode:
            return torch.empty(shape, dtype=tensor.dtype, device="cpu")

    memo: dict[int, object] = {}
    for p in model.parameters():
        shape = (num_experts // ep, *p.shape[1:]) if id(p) in local else p.shape
        memo[id(p)] = torch.nn.Parameter(fake(p, shape), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = fake(b, b.shape)
    copied = copy.deepcopy(model, memo)
    if hasattr(copied, "set_experts_implementation"):
        # transformers' default grouped_mm experts do not run on fake cpu tensors (torch's meta
        # kernel of grouped_mm takes bfloat16 only), its eager ones branch on the routing's
        # values; batched_mm gathers each copy's expert weights with no branch. The copy's
        # FLOPs are not kept, so how its experts compute changes nothing reported.
        copied.set_experts_implementation("batched_mm")

    def leaf(value):
        return fake(value, value.shape) if isinstance(value, torch.Tensor) else value

    return copied, pytree.tree_map(leaf, args), pytree.tree_map(leaf, kwargs)


def _fully_shard(model: torch.nn.Module, dense, efsdp, *, experts: str,
                 experts_dim: int) -> None:
    """Each experts module on ``efsdp`` (dim ``experts_dim``), each block on ``dense``, then the
    root on ``dense``: torchtitan's order, inner units first."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    outermost: list[str] = []
    for path, _ in model.named_modules():
        if path.rpartition(".")[2] == experts and not any(
                path.startswith(f"{outer}.") for outer in outermost):
            outermost.append(path)
    try:
        for path in outermost:
            fully_shard(model.get_submodule(path), mesh=efsdp,
                        shard_placement_fn=lambda _, dim=experts_dim: Shard(dim))
        for block in blocks_of(model):
            fully_shard(block, mesh=dense)
        fully_shard(model, mesh=dense)
    except Exception as error:  # FSDP2 refuses the model as built; torch raises many types
        raise DistributedError(
            f"fully_shard of {type(model).__name__}'s {experts!r} modules on the efsdp mesh "
            f"({efsdp.size()} ranks), then its blocks and root on the fsdp mesh "
            f"({dense.size()} ranks), failed: {type(error).__name__}: {error}") from error
