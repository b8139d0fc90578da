"""One rank of a parallelized model, captured: the joint forward and backward ATen graph of a
DTensor model (tensor and sequence parallel plans, Hugging Face ``tp_plan``), or of an FSDP2 one.

``torch.export`` refuses DTensor inputs and parameters (pytorch issue 175467, "torch.export
does not support DTensor"). After pytorch's ``test/distributed/tensor/test_dtensor_export.py``:
dynamo captures the model with its module stacks, then ``aot_export_joint_with_descriptors``
traces the joint graph of one rank, DTensor lowered to local shapes and ``_c10d_functional``
collectives. FSDP2 models go through ``capture.fsdp`` instead. A backward node carries the
``partitioner_tag`` "is_backward" (`exportflops.graph.walk.phase`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.fx
import torch.fx.traceback as fx_traceback

from ..errors import DistributedError, ExportError
from ..torch_internals import require
from .fsdp import fsdp_graph, has_fsdp
from .hints import first_lines
from .quiet import quiet_capture_log


@contextlib.contextmanager
def rank_graph(model: torch.nn.Module, args: tuple, kwargs: dict,
               train: bool) -> Iterator[torch.fx.Graph]:
    """This rank's graph, its module stacks under the user's paths, open while the caller
    reads it: FSDP2's forward (and in ``train`` its backward), else the DTensor joint graph
    (forward and backward)."""
    traced = (fsdp_graph(model, args, kwargs, train) if has_fsdp(model)
              else _joint_graph(model, args, kwargs))
    with traced as graph:
        _user_module_stacks(graph, model)
        yield graph


@contextlib.contextmanager
def _joint_graph(model: torch.nn.Module, args: tuple,
                 kwargs: dict) -> Iterator[torch.fx.Graph]:
    """The joint forward + backward ATen graph of this rank, traced on fake tensors; open
    while the caller reads it (its tensors belong to the trace's fake mode)."""
    from ..torch_internals import (
        aot_export_joint_with_descriptors, dynamo_graph_capture_for_export, tracing,
    )

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
        _mark_gradients(joint.graph_module.graph)
        _mark_checkpoints(captured.graph, joint.graph_module.graph)
        yield joint.graph_module.graph


def _mark_checkpoints(captured: torch.fx.Graph, joint: torch.fx.Graph) -> None:
    """On the joint graph's ops of each ``torch.utils.checkpoint`` region,
    ``meta["checkpoint_reentrant"]`` (True or False: which kind runs it, its recompute counted
    by `exportflops.count.backward` or `exportflops.count.recompute`), and
    ``meta["checkpoint_whole"]`` where its eager rerun does not stop early
    (`exportflops.graph.walk.reruns`): a reentrant one (``use_reentrant`` unset is reentrant in
    torch 2.13, with a warning) or one with ``early_stop=False``. Dynamo records each
    checkpoint call as a ``tag_activation_checkpoint`` op with its arguments; AOT autograd
    numbers the regions in the order they run, from a counter (``ac_graph_id``,
    torch/_higher_order_ops/wrap.py). Where the counts differ (a checkpoint inside another)
    every region is taken whole, and none is marked reentrant or not."""
    from ..torch_internals import HigherOrderOperator

    calls = [node.kwargs for node in captured.nodes if isinstance(node.target, HigherOrderOperator)
             and node.target.name() == "tag_activation_checkpoint"]
    ids = sorted({node.meta["ac_graph_id"] for node in joint.nodes
                  if node.meta.get("ac_graph_id") is not None})
    regions = dict(zip(ids, calls)) if len(ids) == len(calls) else {}
    for node in joint.nodes:
        region = node.meta.get("ac_graph_id")
        if region is None:
            continue
        call = regions.get(region)
        if call is not None:
            node.meta["checkpoint_reentrant"] = bool(call.get("use_reentrant", True))
        if call is None or call.get("use_reentrant", True) or not call.get("early_stop", True):
            node.meta["checkpoint_whole"] = True


def _mark_gradients(graph: torch.fx.Graph) -> None:
    """On each output holding a gradient, as AOT autograd's descriptors on the output node say:
    ``meta["input_gradient"]`` for an input of the model's call (``GradAOTOutput`` of a
    ``PlainAOTInput``), ``meta["parameter_gradient"]`` (its name) for a parameter, a DTensor's
    through its local tensor: what `exportflops.graph.passes` splits the backward by."""
    output = graph.output_node()
    for value, desc in zip(output.args[0], output.meta.get("desc") or ()):
        while getattr(desc, "attr", None) == "_local_tensor":  # a DTensor's, its local shard's
            desc = desc.base
        grad_of = getattr(desc, "grad_of", None)
        if not isinstance(value, torch.fx.Node) or grad_of is None or grad_of.is_buffer():
            continue
        if grad_of.is_param():
            while hasattr(grad_of, "base"):  # a subclass's inner tensor: its parameter
                grad_of = grad_of.base
            value.meta["parameter_gradient"] = getattr(grad_of, "target", grad_of.expr())
        else:
            value.meta["input_gradient"] = True


def _capture_error(model: torch.nn.Module, error: Exception) -> Exception:
    uneven = _uneven_shards(model)
    if uneven:
        return DistributedError(
            f"{type(model).__name__} could not be captured: the plan splits "
            f"{'; '.join(uneven)}, which the capture of a rank cannot do (its shards must be "
            f"equal). Use a rank count that divides each size, or leave those modules "
            f"unsplit.\ntorch said: {first_lines(error)}")
    return ExportError(type(model).__name__, first_lines(error),
                       "dynamo could not capture the parallelized model, or AOT autograd could "
                       "not trace its joint graph; see torch's message below.")


class ShardedDim(NamedTuple):
    """One dimension of a DTensor parameter that a mesh dimension shards."""

    parameter: str  #: its name, as ``named_parameters()`` gives it
    dim: int  #: the dimension the placement shards
    size: int  #: that dimension's global size
    ranks: int  #: the ranks of the mesh dimension sharding it


def sharded_dims(model: torch.nn.Module) -> list[ShardedDim]:
    """Each dimension of ``model``'s DTensor parameters that a ``Shard`` placement splits."""
    from torch.distributed.tensor import DTensor, Shard

    return [ShardedDim(name, placement.dim, parameter.shape[placement.dim],
                       parameter.device_mesh.size(mesh_dim))
            for name, parameter in model.named_parameters() if isinstance(parameter, DTensor)
            for mesh_dim, placement in enumerate(parameter.placements)
            if isinstance(placement, Shard)]


def _uneven_shards(model: torch.nn.Module) -> list[str]:
    """Each parameter sharded over ranks that do not divide its size: module, parameter,
    dimension, size and rank count, as the error names them."""
    uneven = []
    for shard in sharded_dims(model):
        if shard.size % shard.ranks:
            module, _, leaf = shard.parameter.rpartition(".")
            uneven.append(f"dimension {shard.dim} of {leaf} of module {module or '<root>'!r} "
                          f"({shard.size}) over {shard.ranks} ranks")
    return uneven


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


def _user_module_stacks(graph: torch.fx.Graph, model: torch.nn.Module) -> None:
    """Each node's module stack under the user's paths, where the walker reads it. AOT autograd
    gives a backward node the stack of the forward node it differentiates (``fwd_``)."""
    named = {id(module): path for path, module in model.named_modules()}
    paths: dict[str, str] = {}

    def path_of(source: str) -> str:
        if source not in paths:
            path = user_path(source)
            if path not in named.values():  # a module reached another way than by attributes
                path = named.get(id(_module_at(model, source)), path)
            paths[source] = path
        return paths[source]

    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
        node.meta["nn_module_stack"] = {key: (path_of(path), type_)
                                        for key, (path, type_) in stack.items()}


_DIGIT_CHILD = re.compile(r"\.(\d+)(?=[.\[]|$)")


class _Locals(dict):
    """Dynamo's ``L``, the traced frame's locals: the model under any name, or as the first of
    ``args``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def __missing__(self, key: str) -> object:
        return [self.model] if key == "args" else self.model


def _module_at(model: torch.nn.Module, source: str) -> object:
    """The object dynamo's module ``source`` names, or None. A source is a Python expression
    over the frame's locals ``L`` (torch/_dynamo/source.py, ``Source.name``): a module called
    from a hook is named through the hook, ``L['self'].mlp.experts._forward_hooks[...]
    .args[0]``, which no attribute path gives; evaluated here, its object's path is found."""
    # Dynamo writes a container's child as an attribute of digits (``layers.0``).
    expression = _DIGIT_CHILD.sub(r"._modules['\1']", source)
    try:
        return eval(expression, {"__builtins__": {}, "list": list, "dict": dict},  # noqa: S307
                    {"L": _Locals(model)})
    except Exception:  # a source naming more than attributes, items and hooks
        return None
