"""The backward of a rank's traced graph in the two passes torch's zero-bubble pipeline schedules
run (torch/distributed/pipelining/_backward.py): ``stage_backward_input`` asks autograd for the
gradients of the stage's inputs only, so autograd runs the backward ops those depend on;
``stage_backward_weight`` then asks for the parameters' from the gradients saved on that way,
running the rest.

A rank's graph (`exportflops.capture.dtensor.rank_graph`) holds the backward as ATen ops, each
computing what its consumers take: an op is in the input pass when an input's gradient depends
on it, else in the weight pass. A kernel whose outputs go both ways (``native_layer_norm_
backward``'s input gradient and its weight's) runs in each pass, the input pass asking it for
the outputs on the input's way and the weight pass for the others, through its output mask.
The capture marks each node holding an input's gradient with ``meta["input_gradient"]``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import torch
import torch.fx

from ..errors import InputError
from ..torch_internals import pytree
from .opcall import bind_schema
from .walk import NodeCall, phase, storage_id

Pass = Literal["input", "weight"]

#: The arguments an ATen backward kernel takes to say which of its outputs to compute
#: (``native_layer_norm_backward``'s ``output_mask``, the attention kernels' ``grad_input_mask``).
MASKS = ("output_mask", "grad_input_mask")


def input_way(graph: torch.fx.Graph) -> frozenset[torch.fx.Node]:
    """The backward nodes an input's gradient depends on: the input pass's. A node depends on
    its arguments, and on the earlier nodes writing into the storage of a tensor it reads
    (FSDP2's graph gathers parameters into their unsharded storage in place)."""
    written = _written_before(graph)
    way: set[torch.fx.Node] = set()
    pending = [node for node in graph.nodes if node.meta.get("input_gradient")]
    while pending:
        node = pending.pop()
        if node in way or phase(node) != "backward":
            continue
        way.add(node)
        pending.extend(node.all_input_nodes)
        pending.extend(written.get(node, ()))
    _check_single_uses(graph, way)
    return frozenset(way)


def stage_input_way(graph: torch.fx.Graph,
                    stage_of: Callable[[torch.fx.Node], int | None]) -> frozenset[torch.fx.Node]:
    """The input passes of a whole rank's graph cut into pipeline stages (``stage_of``: a
    node's stage, None for one outside every stage): a backward node of stage s is in its
    stage's input pass when a backward node of an earlier stage depends on it, i.e. when the
    gradient of what stage s received (which the stage before takes) does. A node depends on
    its arguments and on the earlier nodes writing into a storage it reads, as in `input_way`;
    nodes outside every stage pass dependencies on."""
    readers: dict[torch.fx.Node, set[torch.fx.Node]] = {}  # writer -> later readers
    for node, writers in _written_before(graph).items():
        for writer in writers:
            readers.setdefault(writer, set()).add(node)
    reach: dict[torch.fx.Node, float] = {}  # the earliest stage a backward node's result meets
    way: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if phase(node) != "backward":
            continue
        reached = math.inf
        for user in (*node.users, *readers.get(node, ())):
            if phase(user) == "backward":
                stage = stage_of(user)
                reached = min(reached, reach[user], math.inf if stage is None else stage)
        reach[node] = reached
        stage = stage_of(node)
        if stage is not None and reached < stage:
            way.add(node)
    _check_single_uses(graph, way)
    return frozenset(way)


def _check_single_uses(graph: torch.fx.Graph, way: set[torch.fx.Node]) -> None:
    """Each parameter's gradient (``meta["parameter_gradient"]``) starts from one node of the
    input pass: torch's weight pass restarts from the gradients the input pass saved where the
    parameter met the inputs' way (``get_param_groups``); from two or more (a parameter used
    twice: shared layers, a tied embedding and head in one call) autograd recomputes the
    input-pass ops between them in the weight pass too, which this count does not model."""
    for sink in graph.nodes:
        if "parameter_gradient" not in sink.meta or sink in way:
            continue
        starts, seen, pending = set(), set(), [sink]
        while pending:
            node = pending.pop()
            if node in seen or phase(node) != "backward":
                continue
            seen.add(node)
            if node in way:
                starts.add(node)
            else:
                pending.extend(node.all_input_nodes)
        if len(starts) > 1:
            raise InputError(
                f"parameter {sink.meta['parameter_gradient']} gets its gradient from "
                f"{len(starts)} ops on the way to the inputs' gradients "
                f"({', '.join(sorted(n.name for n in starts))}): it is used more than once, "
                f"and torch's weight pass then recomputes the input-gradient ops between "
                f"them, which split_backward does not model; analyze without split_backward")


def _written_before(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Each node -> the earlier nodes writing in place into a storage it reads."""
    writers = _writers(graph)
    order = {node: index for index, node in enumerate(graph.nodes)}
    written: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        earlier = [writer for storage in _storages(node.all_input_nodes)
                   for writer in writers.get(storage, ()) if order[writer] < order[node]]
        if earlier:
            written[node] = earlier
    return written


def _writers(graph: torch.fx.Graph) -> dict[int, list[torch.fx.Node]]:
    """Storage -> the nodes writing into it in place (an op's mutable arguments)."""
    writers: dict[int, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        named = bind_schema(schema, node.args, node.kwargs)
        written = [named[spec.name] for spec in schema.arguments
                   if spec.alias_info is not None and spec.alias_info.is_write]
        for storage in _storages(pytree.tree_leaves(written)):
            writers.setdefault(storage, []).append(node)
    return writers


def _storages(values) -> set[int]:
    """The storages of the tensors the fx nodes among ``values`` hold."""
    return {storage_id(t) for value in values if isinstance(value, torch.fx.Node)
            for t in pytree.tree_leaves(value.meta.get("val"))} - {None}


def halves(call: NodeCall, way: frozenset[torch.fx.Node]) -> list[tuple[Pass, NodeCall]]:
    """Backward ``call`` as it runs in each pass it runs in (``way``: `input_way`): itself in
    the weight pass when no input's gradient depends on it, else in the input pass, and a
    kernel with outputs both ways in each, each pass's call asking for that pass's outputs
    (its mask narrowed to them; without a mask the kernel computes all of them in each)."""
    if call.node not in way:
        return [("weight", call)]
    items = [user for user in call.node.users if _item_user(user)]
    on_way = {user.args[1] for user in items if user in way}
    weight_only = {user.args[1] for user in items if user.users} - on_way
    if not weight_only:
        return [("input", call)]
    mask_name = next((name for name in MASKS if name in call.call.args), None)
    if mask_name is None:
        return [(half, replace(call, name=f"{call.name}.{half}")) for half in ("input", "weight")]
    mask = call.call[mask_name]
    # No graph node: what counts the half reads its arguments, the narrowed mask among them.
    return [(half, replace(call, name=f"{call.name}.{half}", node=None, call=_masked(
        call, mask_name, [bool(wanted) and i in chosen for i, wanted in enumerate(mask)])))
            for half, chosen in (("input", on_way), ("weight", weight_only))]


def _masked(call: NodeCall, mask_name: str, mask: list[bool]):
    """The call's `OpCall` computing only the outputs ``mask`` asks for: its tensor outputs
    are those of each output in turn (an output may hold several, or none)."""
    values = call.node.meta.get("val")
    kept: list = []
    start = 0
    for index, value in enumerate(values if isinstance(values, (list, tuple)) else ()):
        count = sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(value))
        if index < len(mask) and mask[index]:
            kept += call.call.outputs[start:start + count]
        start += count
    return replace(call.call, args={**call.call.args, mask_name: mask}, outputs=tuple(kept))


def _item_user(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem
