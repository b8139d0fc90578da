"""Train mode: the backward ops of every forward node, traced from autograd, not guessed.

For each forward op whose inputs need gradients and whose output receives one, the op is
replayed on fresh fake tensors of the node's shapes, strides and dtypes, and the ATen ops that
``torch.autograd.grad`` dispatches for its vector-Jacobian product are recorded. Those ops are
the op's real backward (``mm`` pairs for a linear, ``convolution_backward`` with its output mask,
``_softmax_backward_data``, ...), counted by the same formula table and charged to the module of
the forward node. Which tensors need gradients follows the graph: parameters with
``requires_grad`` (a frozen parameter needs none), inputs the user marked ``requires_grad``, and
everything computed from them. Gradients flow from every floating output the model returns, as
``loss.backward()`` of a loss computed from all of them.

This module reads the exported graph itself (``meta["val"]`` for the fake tensors to replay):
the walker's shapes and dtypes are not enough to run an op.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export.graph_signature import OutputKind
from torch.utils._python_dispatch import TorchDispatchMode

from .formulas.registry import OpCall
from .walk import NodeCall, op_call, op_name


@dataclass(frozen=True)
class BackwardOps:
    """The backward of one forward node: its recorded ops, or why none could be traced."""

    forward: NodeCall
    calls: list[NodeCall]
    failure: str = ""


def trace_backward(program: torch.export.ExportedProgram, forward: list[NodeCall],
                   renames: dict) -> list[BackwardOps]:
    """The backward ops of every forward node that needs and receives a gradient."""
    graph = program.graph
    by_name = {node.name: node for node in graph.nodes}
    differentiable = _differentiable(graph, _user_outputs(program))
    tracer = _Tracer(_shape_env(graph), renames)
    traced = []
    for call in forward:
        node = None if call.region else by_name[call.name]  # subgraph ops: see their HOP
        outputs = differentiable.get(node)
        if outputs is None:
            continue
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            traced.append(BackwardOps(call, [], "the backward of control flow (torch.cond, map, "
                                                "while_loop) is not traced"))
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        try:
            calls = tracer.backward_of(node, outputs, differentiable)
        except Exception as error:  # any op may refuse a fake replay; the report says which
            traced.append(BackwardOps(call, [], f"{type(error).__name__}: {error}"))
            continue
        traced.append(BackwardOps(call, [
            NodeCall(f"{call.name}.backward.{i}", op.op, op_name(op.op), op, call.stack)
            for i, op in enumerate(calls)
        ]))
    return traced


def _user_outputs(program: torch.export.ExportedProgram) -> set[str]:
    return {spec.arg.name for spec in program.graph_signature.output_specs
            if spec.kind == OutputKind.USER_OUTPUT and hasattr(spec.arg, "name")}


def _differentiable(graph: torch.fx.Graph, outputs: set[str]) -> dict[torch.fx.Node, set[int]]:
    """Nodes that need a gradient and receive one -> indices of their outputs that receive it
    (``{0}`` for a single tensor)."""
    needs = _needs_grad(graph)
    receives: dict[torch.fx.Node, set[int]] = {}
    for node in reversed(graph.nodes):
        if node.op == "output":
            for arg in _input_nodes(node):
                if arg.name in outputs and arg in needs:
                    receives.setdefault(arg, set()).add(0)
        elif node in receives and node.op == "call_function":
            for arg in _input_nodes(node):
                if arg in needs:
                    index = node.args[1] if node.target is operator.getitem else 0
                    receives.setdefault(arg, set()).add(index)
    return receives


def _needs_grad(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    needs = set()
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            if isinstance(val, torch.Tensor) and val.requires_grad:
                needs.add(node)
        elif node.op == "call_function" and _floating(val) and not _grad_disabled(node) and any(
                arg in needs for arg in _input_nodes(node)):
            needs.add(node)
    return needs


def _grad_disabled(node: torch.fx.Node) -> bool:
    """A ``torch.no_grad()`` region, which export wraps in a subgraph: its outputs need none."""
    return (isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target.name() == "wrap_with_set_grad_enabled" and node.args[0] is False)


def _input_nodes(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    return (a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node))


def _floating(val: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
               for v in pytree.tree_leaves(val))


def _shape_env(graph: torch.fx.Graph):
    for node in graph.nodes:
        fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
        if fake_mode is not None:
            return fake_mode.shape_env
    return None


class _Tracer:
    """Replays ops under a fake mode sharing the graph's shape env; caches by op and layout."""

    def __init__(self, shape_env, renames: dict) -> None:
        self.shape_env = shape_env
        self.renames = renames
        self.cache: dict[tuple, list[OpCall]] = {}

    def backward_of(self, node: torch.fx.Node, outputs: set[int],
                    differentiable: dict[torch.fx.Node, set[int]]) -> list[OpCall]:
        flat, spec = pytree.tree_flatten((node.args, node.kwargs))
        grad_positions = {i for i, a in enumerate(flat)
                          if isinstance(a, torch.fx.Node) and a in differentiable
                          and _floating(a.meta.get("val"))}
        key = (node.target, tuple(_layout(a, i in grad_positions) for i, a in enumerate(flat)),
               tuple(sorted(outputs)))
        if key not in self.cache:
            self.cache[key] = self._replay(node.target, flat, spec, grad_positions, outputs)
        return self.cache[key]

    def _replay(self, op, flat: list, spec, grad_positions: set[int],
                outputs: set[int]) -> list[OpCall]:
        with FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=False):
            values = [_fresh(a) for a in flat]
            leaves = [values[i].requires_grad_() for i in sorted(grad_positions)]
            if op._schema.is_mutable:  # an in-place op on a leaf is refused by autograd
                values = [v.clone() if i in grad_positions else v for i, v in enumerate(values)]
            args, kwargs = pytree.tree_unflatten(values, spec)
            result = op(*args, **kwargs)
            results = [result] if isinstance(result, torch.Tensor) else list(result)
            tensors = [results[i] for i in sorted(outputs)
                       if isinstance(results[i], torch.Tensor) and results[i].requires_grad]
            if not tensors or not leaves:
                return []
            grads = [torch.ones_like(t) for t in tensors]
            recorder = _Recorder(self.renames)
            with recorder:
                torch.autograd.grad(tensors, leaves, grads, allow_unused=True)
        return recorder.calls


def _fresh(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   device=value.device)
    return value


def _layout(value: Any, needs_grad: bool) -> Any:
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (str(tuple(value.shape)), str(value.stride()), value.dtype, str(value.device),
                needs_grad)
    return repr(value)


#: Metadata queries the autograd engine makes of every gradient: no tensor, no work.
_ENGINE_QUERIES = {torch.ops.prim.device.default}


class _Recorder(TorchDispatchMode):
    """Records each ATen op autograd dispatches, as the `OpCall` a formula reads."""

    def __init__(self, renames: dict) -> None:
        super().__init__()
        self.renames = renames
        self.calls: list[OpCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func not in _ENGINE_QUERIES:
            self.calls.append(op_call(func, args, kwargs, result, self.renames))
        return result

