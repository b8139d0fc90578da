"""The fast path: export once with each repeated block stubbed, then copy its model's nodes.

`blocks.plan_blocks` says which module calls repeat an earlier one. The model is exported
through a shallow copy of its module tree in which each repeated module's ``forward`` is a
stub: tensors of the recorded output shapes (``zeros``), tied to the call's inputs that need a
gradient so that autograd's flow around the block is unchanged in train mode. The user's
modules are never modified; parameters are shared, so their names and ties are the model's.

The stub's own nodes are then replaced by copies of the model call's nodes, moved to the
repeat's module paths; in train mode the backward records of the model's nodes are copied the
same way. The sizes only the stubs read (an ``aten.sym_size.int`` of an input with a dynamic
size) are dropped, as no full export has them. Counts, module tree and operators are then
built as for a full export.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
from collections import defaultdict
from dataclasses import replace
from typing import Any

import torch

from .blocks import Plan, Repeat, TensorSlot, plan_blocks
from .cheap_run import attributes_kept
from .export import Captured, by_example, capture, value_sizes
from ..records import NodeRecord
from ..records.names import ancestors, parent
from ..graph.stacks import ModuleFrame
from ..torch_internals import has, pytree, require
from ..graph.walk import NodeCall


def stubbed(model: torch.nn.Module, plan: Plan, train: bool,
            chains: Chains | None = None) -> torch.nn.Module:
    """A shallow copy of ``model`` whose repeated modules run their stub. Only the modules on
    the way to a repeat or a model are copied (each with its own ``_modules``); the copies share
    every other module, parameter and buffer with ``model``. A repeat's copy holds no
    parameters, buffers or children (export would lift them for nothing), except in train mode
    when its outputs need a gradient that no input brings: they come from its parameters then.
    A model's copy records the sizes its call sees, which its repeats' stubs take (with
    dynamic shapes they are symbolic: a stub's zeros then have the model's sizes, not the
    example's). With ``chains`` (forward only) a stub makes zeros of its first tensor output
    alone, and returns the model call's own tensors for the others (`_shared_outputs`); one
    called right after a stub of the same model makes none (`Chains`)."""
    copies: dict[str, torch.nn.Module] = {}

    def copied(path: str) -> torch.nn.Module:
        if path not in copies:
            if path:
                owner, _, name = path.rpartition(".")
                holder = copied(owner)
                module = holder._modules[name] = copy.copy(holder._modules[name])
            else:
                module = copy.copy(model)
            module._modules = dict(module._modules)
            copies[path] = module
        return copies[path]

    seen: dict[str, list] = {}
    for path in {repeat.model for repeat in plan.repeats.values()}:
        module = copied(path)
        module.forward = _recording(module, seen.setdefault(path, [None, None]))
    for repeat in plan.repeats.values():
        module = copied(repeat.path)
        if not train or repeat.grad_inputs:
            module._parameters, module._buffers, module._modules = {}, {}, {}
        # An instance attribute of the copy; ``nn.Module.__call__`` calls it as ``forward``.
        module.forward = _stub(module, repeat, train, seen[repeat.model], chains)
    return copied("")


def _copied_paths(plan: Plan) -> set[str]:
    """The modules `stubbed` copies: each repeat and model, and every module above one."""
    return {above for repeat in plan.repeats.values() for path in (repeat.path, repeat.model)
            for above in ancestors(path)}


def _recording(module: torch.nn.Module, seen: list):
    """The module's own forward, keeping the sizes of its inputs and its output in ``seen``."""
    own = type(module).forward.__get__(module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        output = own(*args, **kwargs)
        seen[:] = [_sizes((args, kwargs)), output]
        return output
    return forward


def _sizes(tree: Any) -> list:
    """The shape of every tensor leaf, each size as its expression (structural equality, which
    installs no guard on a symbolic size)."""
    return [tuple(d.node.expr if isinstance(d, torch.SymInt) else d for d in t.shape)
            for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _stub(module: torch.nn.Module, repeat: Repeat, train: bool, seen: list,
          chains: Chains | None):
    """Zeros of the model call's outputs. In train mode an output that needs a gradient is tied
    to every input that requires one (or else to the module's parameters), as the block's own
    output is: the backward then flows around the block as it does around the real one."""
    def forward(*args: Any, **kwargs: Any) -> Any:
        sizes, output = seen
        if sizes != _sizes((args, kwargs)):
            # Equal at the example's sizes, not as functions of the dynamic ones.
            raise NotRepeated(repeat.path)
        if chains is not None:
            return chains.outputs(repeat, output)
        anchors = []
        if train:
            anchors = [t for t in pytree.tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            anchors = anchors or [p for p in module.parameters() if p.requires_grad]
        shapes = iter(t.shape for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
        return pytree.tree_map_only(TensorSlot, lambda slot: _made(slot, next(shapes), anchors),
                                    repeat.outputs)
    return forward


def _shared_outputs(slots: Any, output: Any) -> Any:
    """A stub's outputs with one op: zeros for the first tensor (where the repeat's copied
    nodes go in the graph), the model call's own tensors for the rest. Each export op costs as
    much as some 10 ops under FlopCounterMode, and a Llama block's stub made 3 (its output and
    its key and value). Equal tensors to every op that reads them, so equal counts, as long as
    nothing writes one in place: `fast_capture` checks that (`_writes_across`)."""
    tensors = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    leaves, spec = pytree.tree_flatten(slots)
    slots_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, TensorSlot)]
    for index, tensor in zip(slots_at, tensors):
        leaves[index] = tensor
    if slots_at:
        first = leaves[slots_at[0]]
        leaves[slots_at[0]] = torch.zeros(first.shape, dtype=first.dtype, device=first.device)
    return pytree.tree_unflatten(leaves, spec)


class Chains:
    """Forward only: a stub called right after a stub of the same model and parent, with no op
    traced between them (the export's graph has not grown), returns the other's tensors and
    makes no op. Each export op costs as much as some 10 ops under FlopCounterMode, and
    Llama-3-70B's 80 stubs made 80 of its 137 ops (59 with chains). `Expansion` puts such a
    repeat's copies right after those of the repeat it follows."""

    def __init__(self) -> None:
        self.follows: dict[str, str] = {}
        """Path of each repeat whose stub made no op -> the repeat it follows."""
        self.last: tuple | None = None
        """The last stub's repeat, the graph's size after it, and its output's leaves and spec."""

    def outputs(self, repeat: Repeat, output: Any) -> Any:
        size, last = _traced_size(), self.last
        # Siblings (a stack's blocks) run in one call of the module around them, which their
        # copies' frames take; `Expansion.forward` checks that the graph's next node agrees.
        if size is not None and last is not None and last[0].model == repeat.model and \
                last[1] == size and parent(last[0].path) == parent(repeat.path):
            self.follows[repeat.path] = last[0].path
            leaves, spec = last[2], last[3]
        else:
            leaves, spec = pytree.tree_flatten(_shared_outputs(repeat.outputs, output))
            size = _traced_size()
        self.last = repeat, size, leaves, spec
        return pytree.tree_unflatten(list(leaves), spec)  # a container of its own


def _traced_size() -> int | None:
    """How many nodes the export has traced so far; None where this torch does not say."""
    if not has("get_proxy_mode"):
        return None
    graph = getattr(getattr(require("get_proxy_mode")(), "tracer", None), "graph", None)
    return None if graph is None else len(graph.nodes)


def _writes_across(program: torch.export.ExportedProgram) -> bool:
    """Whether the program writes in place a tensor that its own module call did not make: an
    input or buffer, or an op's argument whose base (through views) another call made. A
    write within one call (``scores += bias`` on the call's own scores) reaches no stub's
    output."""
    signature = program.graph_signature
    if signature.user_inputs_to_mutate or signature.buffers_to_mutate:
        return True
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or \
                not target._schema.is_mutable:
            continue
        for index, argument in enumerate(target._schema.arguments):
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            if argument.alias_info is None or not argument.alias_info.is_write or \
                    not isinstance(value, torch.fx.Node):
                continue
            base = _base(value)
            if base.op != "call_function" or \
                    base.meta.get("nn_module_stack") != node.meta.get("nn_module_stack"):
                return True
    return False


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose tensor ``node``'s is a view of (itself if none)."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node) \
            and (node.target is operator.getitem or (
                isinstance(node.target, torch._ops.OpOverload)
                and any(r.alias_info is not None for r in node.target._schema.returns))):
        node = node.args[0]
    return node


def _made(slot: TensorSlot, shape: Any, anchors: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=slot.dtype, device=slot.device)
    if slot.requires_grad and anchors:
        out = out + sum(a.sum() for a in anchors) * 0
    return out


class NotRepeated(Exception):
    """A repeat may not count as its model: one of them runs in a wrapped region, or
    gradients reach the outputs of one of them only in part (a ``detach`` downstream)."""


class Expansion:
    """Replaces the stubs' nodes by copies of the model calls' nodes, forward then backward."""

    def __init__(self, plan: Plan, follows: dict[str, str] | None = None) -> None:
        self.plan = plan
        self.after = {before: path for path, before in (follows or {}).items()}
        """Path of each repeat -> the repeat whose stub made no op right after it (`Chains`)."""
        self.copies: dict[str, tuple[NodeCall, Repeat]] = {}
        """Name of each copied node -> (the node it copies, its repeat)."""
        self.within: dict[str, list[NodeCall]] = {}
        """Path of each model and repeat -> the graph's nodes inside its call (`forward`)."""

    def forward(self, nodes: list[NodeCall]) -> list[NodeCall]:
        repeats = self.plan.repeats
        of_model: dict[str, list[NodeCall]] = defaultdict(list)
        models = {repeat.model for repeat in repeats.values()}
        for node in nodes:
            # Wrapped regions (grad mode, autocast, checkpointing, custom Functions) change
            # what the backward of a block is; a block in or around one is traced in full.
            if (node.region or node.autograd_function) and any(
                    f.path in models or f.path in repeats for f in node.stack):
                raise NotRepeated(node.name)
            for frame in node.stack:
                if frame.path in models:
                    of_model[frame.path].append(node)
        self.within = {path: list(of_model[path]) for path in models}
        for_stubs = _stub_sizes(nodes, repeats)
        expanded, done = [], set()
        # The calls around the last repeat that stubs without an op followed (`Chains`): their
        # copies take its frames, so the graph's next node must still be inside those calls.
        around, chained = None, None
        for node in nodes:
            index = next((i for i, f in enumerate(node.stack) if f.path in repeats), None)
            path = None if index is None else node.stack[index].path
            if around is not None and path != chained:
                if node.stack[:len(around)] != around:
                    raise NotRepeated(chained)
                around = None
            if index is None:
                if node.node not in for_stubs:
                    expanded.append(node)
                continue
            self.within.setdefault(path, []).append(node)
            if path in done:
                continue
            done.add(path)
            frame = node.stack[index]
            for repeat in self._chain(path):
                call = frame.call_key.replace(path, repeat.path, 1)
                outer = node.stack[:index] + (ModuleFrame(repeat.path, frame.type_name, call),)
                expanded += self._copied(of_model[repeat.model], repeat, outer)
            if path in self.after:
                around, chained = node.stack[:index], path
        if around is not None and any(frame.path for frame in around):
            raise NotRepeated(chained)  # the graph ends: only the root's call is sure to hold it
        return expanded

    def _chain(self, path: str) -> list[Repeat]:
        """The repeat at ``path`` and those whose stubs made no op right after it, in order."""
        chain = [self.plan.repeats[path]]
        while chain[-1].path in self.after:
            chain.append(self.plan.repeats[self.after[chain[-1].path]])
        return chain

    def _copied(self, originals: list[NodeCall], repeat: Repeat,
                outer: tuple[ModuleFrame, ...]) -> list[NodeCall]:
        copies = []
        # A block's nodes share a few module stacks: each is moved once per repeat.
        stacks: dict[tuple[ModuleFrame, ...], tuple[ModuleFrame, ...]] = {}
        for original in originals:
            stack = stacks.get(original.stack)
            if stack is None:
                stack = stacks[original.stack] = _moved_stack(original.stack, repeat, outer)
            moved = replace(original, name=f"{repeat.path}:{original.name}", stack=stack,
                            node=None)
            self.copies[moved.name] = (original, repeat)
            copies.append(moved)
        return copies

    def backward(self, forward: list[NodeCall], records: list[NodeRecord],
                 received: dict[torch.fx.Node, bool]) -> list[NodeRecord]:
        """The backward records in the order of the expanded forward nodes. A repeat's are its
        model's when every output of both that needs a gradient receives one (equal inputs,
        equal graphs: then equal backward); otherwise `NotRepeated`."""
        for path, calls in self.within.items():
            inside = {call.node for call in calls}
            for call in calls:
                leaves = any(user not in inside for user in call.node.users)
                if leaves and not received.get(call.node, True):
                    raise NotRepeated(path)
        by_forward: dict[str, list[NodeRecord]] = defaultdict(list)
        for record in records:
            by_forward[record.differentiates].append(record)
        expanded = []
        for node in forward:
            if node.name not in self.copies:
                expanded += by_forward.get(node.name, [])
                continue
            original, repeat = self.copies[node.name]
            expanded += [record.model_copy(update={
                "name": f"{repeat.path}:{record.name}",
                "module": _rebased(record.module, repeat),
                "differentiates": node.name}) for record in by_forward.get(original.name, [])]
        return expanded


def _stub_sizes(nodes: list[NodeCall], repeats: dict[str, Repeat]) -> set[torch.fx.Node]:
    """The graph's size reads and size arithmetic (``aten.sym_size.int``, a product of sizes)
    that only the stubs' zeros use: a stub takes its model's symbolic output sizes from the
    graph's inputs, where the block itself may never read a size. The full export has no such
    node, so the expanded graph drops them (a size the rest of the graph reads is kept)."""
    in_stubs = {node.node for node in nodes
                if node.node is not None and any(f.path in repeats for f in node.stack)}
    feeding: set[torch.fx.Node] = set()
    for node in reversed(nodes):  # users first
        read = node.node
        if read is None or read in in_stubs or any(isinstance(leaf, torch.Tensor) for leaf
                                                   in pytree.tree_leaves(read.meta.get("val"))):
            continue
        if read.users and all(user in in_stubs or user in feeding for user in read.users):
            feeding.add(read)
    return feeding


def _moved_stack(stack: tuple[ModuleFrame, ...], repeat: Repeat,
                 outer: tuple[ModuleFrame, ...]) -> tuple[ModuleFrame, ...]:
    """A model node's module stack as its copy in ``repeat`` has it: ``outer`` (the repeat's
    frames), then the frames inside the model, moved to the repeat's paths."""
    index = next(i for i, f in enumerate(stack) if f.path == repeat.model)
    return outer + tuple(ModuleFrame(_rebased(f.path, repeat), f.type_name,
                                     f.call_key.replace(repeat.model, repeat.path, 1))
                         for f in stack[index + 1:])


def _rebased(path: str, repeat: Repeat) -> str:
    return repeat.path + path[len(repeat.model):]


def fast_capture(model: torch.nn.Module, args: Any, kwargs: dict | None, train: bool,
                 dynamic_shapes: Any = None) -> tuple[Captured | None, Expansion | None]:
    """The model exported with its repeats stubbed, and how to expand them; (None, None) when
    there is no repeat, the stubbed export fails, or it reads sizes from the values of real
    inputs (the full export then runs, and measures those on the example)."""
    if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
        return None, None
    # In the grad mode the export runs in (forward only: without grad, `export._forward_only`),
    # so that the pass sees the calls the export traces; without grad it records no autograd.
    with torch.no_grad() if not train else contextlib.nullcontext():
        plan = plan_blocks(model, args, kwargs or {})
    if not plan.repeats:
        return None, None
    # The stubs' zeros are no example to decide a branch on values by: the full export's.
    export = functools.partial(capture, args=args, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
                               forward_only=not train, by_values=False)
    # A copy shares its original's containers: what the export's forward puts in one (a cache
    # dict) is taken out of the original, as export does on the modules it runs itself.
    originals = [model.get_submodule(path) for path in _copied_paths(plan)]
    try:
        captured, chains = None, Chains()
        with attributes_kept(originals):
            # Forward only, stubs of one op at most, unless the program writes in place a
            # tensor a stub may have returned (then fresh zeros for every output).
            if not train:
                captured = export(stubbed(model, plan, train, chains))
                captured = None if _writes_across(captured.program) else captured
            if captured is None:
                captured, chains = export(stubbed(model, plan, train)), Chains()
    except Exception:  # the full export fails the same way and says why
        return None, None
    if by_example(model, args, kwargs or {}, dynamic_shapes) and value_sizes(
            captured.program.graph_module):
        return None, None  # sizes read from values (a .tolist()), which the full export measures
    return replace(captured, module=model), Expansion(plan, chains.follows)
