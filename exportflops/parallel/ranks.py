"""Parallelized models: each rank's counts from its local shards, and every collective it issues.

A model sharded with torch.distributed (tensor and sequence parallel plans on DTensor, Hugging
Face ``tp_plan``) cannot go through ``torch.export`` (it refuses DTensor inputs and parameters,
pytorch issue 175467). This is a second capture for such models, after pytorch's
``test/distributed/tensor/test_dtensor_export.py``: dynamo captures the model with its module
stacks, then ``aot_export_joint_with_descriptors`` traces the joint forward and backward ATen
graph of one rank, DTensor lowered to local shapes and ``_c10d_functional`` collectives. The
walker, the formula table and the aggregation are the ones every analysis uses.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator

import torch
import torch.fx
import torch.fx.traceback as fx_traceback

from ..aggregate import build_report
from ..attribution import module_tree
from ..capture.hints import first_lines
from ..count.apply import count_node
from ..errors import DistributedError, ExportError
from ..formulas.collectives import KINDS, NAMESPACES, message_bytes
from ..formulas.registry import FormulaTable
from ..records.names import qualified_name
from ..capture.quiet import quiet_capture_log
from ..records import Collective, Report, TensorSpec
from ..torch_internals import OpOverload, require
from ..version import __version__
from ..graph.walk import NodeCall, read_graph


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
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


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


def analyze_parallel(model: torch.nn.Module, args: tuple, kwargs: dict, table: FormulaTable, *,
                     strict: bool, mode: str, inputs: list[TensorSpec]) -> Report:
    """The report of this process's rank: counts of its local shards (forward, and the
    backward in train mode) and the collectives it issues."""
    import torch.distributed as dist

    name = type(model).__name__
    if not dist.is_initialized():
        raise DistributedError(
            f"{name} is parallelized (DTensor parameters) but no process group is set up: "
            f"analyze inside exportflops.fake_process_group(world_size), or after "
            f"torch.distributed.init_process_group().")
    from ..capture.fsdp import fsdp_graph, has_fsdp

    traced = (fsdp_graph(model, args, kwargs, mode == "train") if has_fsdp(model)
              else _joint_graph(model, args, kwargs))
    with traced as graph:
        _user_module_stacks(graph)
        calls = read_graph(graph).nodes
        phases = {call.name: _phase(call) for call in calls}
        if mode == "forward":
            calls = [call for call in calls if phases[call.name] == "forward"]
        nodes = [count_node(call, table, strict=strict, phase=phases[call.name])
                 for call in calls]
        collectives = [_collective(call, phases[call.name]) for call in calls
                       if _kind(call) is not None]
        tree, tied = module_tree(calls, _local_parameters(model), model,
                                 qualified_name(type(model)))
    report = build_report(nodes, tree, tied, model=name, inputs=inputs,
                          torch_version=torch.__version__, exportflops_version=__version__,
                          mode=mode)
    return report.model_copy(update={"world_size": dist.get_world_size(),
                                     "rank": dist.get_rank(), "collectives": collectives})


@contextlib.contextmanager
def _joint_graph(model: torch.nn.Module, args: tuple,
                 kwargs: dict) -> Iterator[torch.fx.Graph]:
    """The joint forward + backward ATen graph of this rank, traced on fake tensors; open
    while the caller reads it (its tensors belong to the trace's fake mode)."""
    from ..torch_internals import dynamo_graph_capture_for_export
    from ..torch_internals import aot_export_joint_with_descriptors
    from ..torch_internals import tracing

    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(quiet_capture_log())
        try:
            # Tracing runs the forward on fake tensors: the caller's random stream stays as it
            # was. Sizes stay the inputs' (dynamo makes a size it saw change symbolic).
            with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                    fx_traceback.preserve_node_meta(), \
                    require("dynamo_config").patch(automatic_dynamic_shapes=False):
                captured = dynamo_graph_capture_for_export(model)(*args, **kwargs)
            stack.enter_context(tracing(captured.meta.get("tracing_context")))
            stack.enter_context(torch.enable_grad())
            joint = aot_export_joint_with_descriptors(stack, captured, args, kwargs)
        except Exception as error:  # torch raises many types; all become one error with a hint
            raise _capture_error(model, error) from error
        yield joint.graph_module.graph


def _capture_error(model: torch.nn.Module, error: Exception) -> Exception:
    return ExportError(type(model).__name__, first_lines(error),
                       "dynamo could not capture the parallelized model, or AOT autograd could "
                       "not trace its joint graph; see torch's message below.")


#: How dynamo names a module: ``L['self'].layers[0]``, ``L['self']._modules['mlp']``, ...;
#: the root is ``L['args'][0]`` where a decorator's wrapper takes the forward's ``self`` in
#: its ``*args`` (transformers' ``deprecate_kwarg`` since 5.24).
_ROOT = re.compile(r"^L\[(?:'args'\]\[0\]|'[^']+'\])\.?")
_ITEM = re.compile(r"\.?(?:_modules)?\[(?:'([^']+)'|(\d+))\]")


def user_path(source: str) -> str:
    """A dynamo module source -> the ``named_modules()`` path: ``L['self'].layers[0].mlp`` is
    ``layers.0.mlp``."""
    path = _ITEM.sub(lambda m: "." + (m[1] or m[2]), _ROOT.sub("", source))
    return path.lstrip(".")


def _user_module_stacks(graph: torch.fx.Graph) -> None:
    """Each node's module stack under the user's paths, where the walker reads it. AOT autograd
    gives a backward node the stack of the forward node it differentiates (``fwd_``)."""
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
        node.meta["nn_module_stack"] = {key: (user_path(path), type_)
                                        for key, (path, type_) in stack.items()}


def _phase(call: NodeCall) -> str:
    tag = call.node.meta.get("partitioner_tag") if call.node is not None else None
    return "backward" if tag == "is_backward" else "forward"


def _kind(call: NodeCall):
    op = call.op
    if isinstance(op, OpOverload) and op.namespace in NAMESPACES:
        return KINDS.get(op._opname)
    return None


def _collective(call: NodeCall, phase: str) -> Collective:
    from torch.distributed.distributed_c10d import _resolve_process_group

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
        mesh_dim = described.removeprefix("mesh_") if described.startswith("mesh_") else ""
    else:  # the size is the shards'
        group, size, mesh_dim = "unknown", kind.group_size(call.call), ""
    return Collective(op=kind.name, bytes=message_bytes(kind, call.call),
                      dtype=str(dtype).removeprefix("torch."), phase=phase, group_size=size,
                      group=group, mesh_dim=mesh_dim, module=call.module, node=call.name,
                      torch_op=call.op_name, bandwidth_factor=float(kind.factor(size)))


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


def _local_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, this rank's shard) per parameter; a tied parameter keeps one shard object."""
    from torch.distributed.tensor import DTensor

    shards: dict[int, torch.Tensor] = {}
    named = model.named_parameters(remove_duplicate=False)
    return [(name, shards.setdefault(id(p), p.to_local() if isinstance(p, DTensor) else p))
            for name, p in named]
