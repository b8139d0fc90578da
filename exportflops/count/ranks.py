"""Parallelized models, one rank at a time: the process group a rank runs in, the parameters
it holds (its local shards), and the collectives it issues, with nccl-tests' message sizes.

`analyze` counts a rank as it counts any model (`exportflops.api`): the rank's graph comes from
`exportflops.capture.dtensor`, its nodes go through the one counting tail (formulas and
decompositions), and this module adds the rank's fields to the report.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import NamedTuple

import torch
import torch.fx

from ..capture.held import copied
from ..errors import DistributedError, InputError
from ..formulas.collectives import KINDS, NAMESPACES, message_bytes
from ..graph.passes import halves, input_way
from ..graph.walk import NodeCall, phase, recomputed, reruns
from ..records import Collective
from ..torch_internals import FakeTensorMode, OpOverload, require


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """One CPU process standing for ``rank`` of ``world_size``: torch's fake process group as the
    default group, destroyed on exit (also on error). Collectives do not communicate; build the
    device mesh and parallelize the model inside it, parameters on ``meta``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
    import torch.distributed as dist
    # torch's fake backend registers itself with torch.distributed on this import.
    FakeStore = require("fake_store")

    if dist.is_initialized():
        raise DistributedError(
            "fake_process_group() needs no process group, but one is set up already "
            f"({dist.get_backend()}, world size {dist.get_world_size()}): analyze under it "
            "directly, or call torch.distributed.destroy_process_group() first.")
    # init_process_group installs an excepthook that prefixes every later traceback with
    # "[rankN]:"; the process is not a rank once the block ends.
    excepthook = sys.excepthook
    try:
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        try:
            yield
        finally:
            dist.destroy_process_group()
            # DTensor caches each op's output specs by its inputs' specs, whose meshes compare
            # equal by shape and names, not groups (DeviceMesh.__eq__): a later rank in another
            # tp group would be handed this rank's meshes, whose groups are destroyed here.
            require("clear_sharding_prop_cache")()
    finally:
        sys.excepthook = excepthook


def fake_copy(model: torch.nn.Module, args: tuple, kwargs: dict,
              local_shape: Callable[[torch.nn.Parameter], tuple] | None = None,
              ) -> tuple[torch.nn.Module, tuple, dict]:
    """A copy of ``model`` and its inputs on fake cpu tensors of the same dtypes (FSDP2 refuses
    meta; nothing is allocated, the caller's model is untouched), each parameter of
    ``local_shape(p)`` (default its shape), tied parameters kept tied, tensors held as plain
    attributes copied too; every tensor the inputs hold is a fake one, whatever holds it
    (`capture.held.copied`: the user's objects, a filled cache, are left as they are)."""
    mode = FakeTensorMode()

    def fake(tensor: torch.Tensor, shape) -> torch.Tensor:
        with mode:
            return torch.empty(shape, dtype=tensor.dtype, device="cpu")

    memo: dict[int, object] = {}
    for p in model.parameters():
        shape = p.shape if local_shape is None else local_shape(p)
        memo[id(p)] = torch.nn.Parameter(fake(p, shape), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = fake(b, b.shape)
    for module in model.modules():  # a tensor held as a plain attribute (a scale, a mask)
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = fake(value, value.shape)
    fake_model = copy.deepcopy(model, memo)

    def leaf(value: torch.Tensor) -> torch.Tensor:
        # An input keeps whether it needs a gradient (a stage's hidden state).
        return fake(value, value.shape).requires_grad_(value.requires_grad)

    # Every tensor the inputs hold, in any object (a user's filled DynamicCache keeps its keys
    # and values on its layers), and one memo with the model's: an input holding a parameter
    # gets the fake parameter.
    fake_args, fake_kwargs = copied((args, kwargs), leaf, memo)
    return fake_model, fake_args, fake_kwargs


def is_parallelized(model: object) -> bool:
    """Whether ``model`` holds DTensor parameters or buffers, or FSDP2 modules. A model holding
    them has imported their modules: an unparallelized model's analysis imports neither."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if not isinstance(model, torch.nn.Module) or (dtensor is None and fsdp is None):
        return False
    tensors = [*model.parameters(), *model.buffers()]
    return ((dtensor is not None and any(isinstance(t, dtensor.DTensor) for t in tensors))
            or (fsdp is not None and any(isinstance(m, fsdp.FSDPModule)
                                         for m in model.modules())))


def check_process_group(model: torch.nn.Module) -> None:
    """A parallelized model is analyzed as one rank of a process group: there must be one."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DistributedError(
            f"{type(model).__name__} is parallelized (DTensor parameters) but no process group "
            f"is set up: analyze inside exportflops.fake_process_group(world_size), or after "
            f"torch.distributed.init_process_group().")


class RankRun(NamedTuple):
    """One call as this rank runs it."""

    phase: str
    """``forward`` or ``backward``."""
    gradient: str
    """With the backward split: the pass it runs in, ``input`` or ``weight``; else ""."""
    call: NodeCall
    """The call, renamed where it runs more than once (``.recompute``, a pass of a kernel
    serving both)."""
    differentiates: str = ""
    """For a forward op the count reruns in the backward: the op."""
    rerun: bool = False
    """Whether activation checkpointing reruns it in the backward (an op copied from the
    forward, or one FSDP2's trace recorded there)."""


def rank_runs(graph: torch.fx.Graph, calls: list[NodeCall], train: bool,
              split: bool | Callable[[torch.fx.Graph], frozenset]) -> list[RankRun]:
    """What this rank runs of its graph's ``calls``: the forward, and in ``train`` the backward
    (``split``: each op in its pass, `exportflops.graph.passes`; a function of the graph gives
    the input pass's nodes, else `input_way`) and the forward ops of checkpointed regions eager
    activation checkpointing reruns in the backward (`reruns`; FSDP2's trace has the rerun
    itself)."""
    phases = {call.name: phase(call.node) for call in calls}
    again = set(reruns(graph)) if train else set()
    rerun = [call for call in calls if call.node in again]
    checkpointed = [call for call in calls if recomputed(call.node)]
    if split and checkpointed:
        first = checkpointed[0]
        raise InputError(
            f"node {first.name} in module {first.module or '(root)'} is in an activation "
            f"checkpoint: with the backward in two passes torch recomputes a region in each "
            f"pass that unpacks it, which this count does not model; analyze without "
            f"split_backward, or without checkpointing")
    way = (split(graph) if callable(split) else input_way(graph)) if split else None
    runs = [RankRun(phases[call.name], half, run,
                    rerun=phases[call.name] == "backward" and recomputed(call.node))
            for call in calls if train or phases[call.name] == "forward"
            for half, run in (halves(call, way) if way is not None
                              and phases[call.name] == "backward" else [("", call)])]
    return runs + [RankRun("backward", "", replace(call, name=f"{call.name}.recompute"),
                           differentiates=call.name, rerun=True) for call in rerun]


def rank_fields(runs: list[RankRun], dims: dict[str, str]) -> dict:
    """The fields a rank's report adds: the world, this rank, and the collectives it issues
    (``runs``: `rank_runs`; ``dims``: `mesh_dims`)."""
    import torch.distributed as dist

    return {"world_size": dist.get_world_size(), "rank": dist.get_rank(),
            "collectives": [collective(run.call, run.phase, run.gradient, dims)
                            for run in runs if _kind(run.call) is not None]}


def mesh_dims(model: torch.nn.Module) -> dict[str, str]:
    """{process group name: mesh dimension name} of the meshes ``model``'s DTensor parameters
    and buffers live on (FSDP2's sharded ones too). A dimension spanning the whole world gets
    the default group, which torch describes as no mesh dimension (``_init_one_process_group``
    in torch/distributed/device_mesh.py): the mesh names it here. A group two meshes name
    differently is left out (no one dimension)."""
    from torch.distributed.tensor import DTensor

    meshes = {id(t.device_mesh): t.device_mesh for t in (*model.parameters(), *model.buffers())
              if isinstance(t, DTensor)}
    names: dict[str, set[str]] = {}
    for mesh in meshes.values():
        for dim, name in enumerate(mesh.mesh_dim_names or ()):
            names.setdefault(mesh.get_group(dim).group_name, set()).add(name)
    return {group: dim for group, (dim, *others) in names.items() if not others}


def _kind(call: NodeCall):
    op = call.op
    if isinstance(op, OpOverload) and op.namespace in NAMESPACES:
        return KINDS.get(op._opname)
    return None


def collective(call: NodeCall, phase: str, gradient: str = "",
               dims: dict[str, str] | None = None) -> Collective:
    """``call``'s `Collective`, its mesh dimension ``dims``' name of its group (`mesh_dims`),
    else torch's description of a mesh's group (``mesh_<name>``), else none."""
    _resolve_process_group = require("resolve_process_group")

    kind = _kind(call)
    tensors = [*call.call.tensor_inputs()]
    dtype = tensors[0].dtype if tensors else call.call.out.dtype
    if "group_name" in call.call.args:  # a functional collective names its group
        process_group = _resolve_process_group(str(call.call["group_name"]))
    else:  # c10d's in-place ops (FSDP2) hold the group object, boxed for TorchScript
        process_group = _process_group_argument(call.node)
    if process_group is not None:
        group, size = process_group.group_name, process_group.size()
        described = getattr(process_group, "group_desc", "") or ""
        mesh_dim = (dims or {}).get(group) or (
            described.removeprefix("mesh_") if described.startswith("mesh_") else "")
    else:  # the size is the shards'
        group, size, mesh_dim = "unknown", kind.group_size(call.call), ""
    return Collective(op=kind.name, bytes=message_bytes(kind, call.call),
                      dtype=str(dtype).removeprefix("torch."), phase=phase, group_size=size,
                      group=group, mesh_dim=mesh_dim, module=call.module, node=call.name,
                      torch_op=call.op_name, bandwidth_factor=float(kind.factor(size)),
                      gradient=gradient)


def _process_group_argument(node: torch.fx.Node | None):
    """The ProcessGroup a c10d op's graph node passes (a get_attr of the boxed object)."""
    if node is None:
        return None
    for arg in [*node.args, *node.kwargs.values()]:
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            value = getattr(node.graph.owning_module, arg.target, None)
            if isinstance(value, torch.ScriptObject):
                try:
                    return torch.distributed.ProcessGroup.unbox(value)
                except RuntimeError:  # another TorchScript object
                    continue
    return None


def local_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, this rank's shard) per parameter; a tied parameter keeps one shard object."""
    from torch.distributed.tensor import DTensor

    shards: dict[int, torch.Tensor] = {}
    named = model.named_parameters(remove_duplicate=False)
    return [(name, shards.setdefault(id(p), p.to_local() if isinstance(p, DTensor) else p))
            for name, p in named]
