"""Train mode: the backward ops of every forward node, traced from autograd, not guessed.

For each forward op whose inputs need gradients and whose output receives one, the op is
replayed on fresh fake tensors of the node's shapes, strides and dtypes, and the ATen ops that
``torch.autograd.grad`` dispatches for its vector-Jacobian product are recorded. Those ops are
the op's real backward (``mm`` pairs for a linear, ``convolution_backward`` with its output mask,
``_softmax_backward_data``, ...), counted by the same formula table and charged to the module of
the forward node. Which tensors need gradients follows the graph: parameters with
``requires_grad`` (a frozen parameter needs none), inputs the user marked ``requires_grad``, and
what autograd computes from them (replaying each op says which outputs it tracks: none for
``detach``, comparisons, ``argmax``, ``zeros_like``). Gradients flow from every floating output
the model returns, as ``loss.backward()`` of a loss computed from all of them. An op reading a
tensor written in place through a view since (``key[..., :n] = k_nope``) reads the write's
result, as autograd's ``CopySlices`` has it (`graph.writes`).

Flex attention's backward is the ``flex_attention_backward`` call its autograd makes, built
from the forward call (a higher-order op's replay records nothing of its own), and its
``score_mod``'s ops are differentiated op by op, per score, as the forward counts them.

Run-once wrappers are gone through op by op: an autocast region's ops are replayed under its
autocast (the backward runs in the dtypes the forward ran in), a ``no_grad`` region needs no
gradient, and a checkpointed region is differentiated and also recomputed in the backward. The
inlined forward of a custom ``torch.autograd.Function`` gets no backward of its own: autograd
runs the Function's backward, user code export does not capture, so it is reported untraced.

This module reads the exported graph itself (``meta["val"]`` for the fake tensors to replay):
the walker's shapes and dtypes are not enough to run an op.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx

from .replay import Tracer
from ..errors import InputError
from ..formulas.control_flow import GATHERS
from ..torch_internals import HigherOrderOperator, OpOverload, pytree
from ..graph.walk import example_value, GraphRead, NodeCall, RUN_ONCE, subgraphs
from ..graph.writes import current_values
from .backward_calls import (backward_call, CONTROL_FLOW_REASON, custom_function_reason,
                             flat_apply_reason, flex_backward, gather_backward,
                             SCORE_MOD_LAYOUT_REASON)
from .fx_reads import (applied_function, floating, floating_outputs, grad_off, input_nodes,
                       input_nodes_of, output_values, user_outputs, wrapper_operands)


#: Activation checkpointing as export leaves it: the higher-order ops dynamo emits, and
#: torch.utils.checkpoint's reentrant variant, a custom Function whose backward reruns its region
#: with grad on and then backpropagates through it (non-strict export inlines its forward as a
#: no_grad wrapper).
CHECKPOINT_OPS = frozenset({"tag_activation_checkpoint", "wrap_activation_checkpoint"})
CHECKPOINT_FUNCTIONS = frozenset({"torch.utils.checkpoint.CheckpointFunction"})
RECOMPUTED = ("recomputed in the backward: activation checkpointing discarded this op's "
              "activations and reruns it before differentiating it")
#: Flex attention's ``score_mod`` takes the score, then batch, head, query and key indices.
SCORE_MOD_INDICES = 4


@dataclass(frozen=True)
class BackwardOps:
    """The backward of one forward node: its recorded ops, or why none could be traced."""

    forward: NodeCall
    calls: list[NodeCall]
    failure: str = ""
    note: str = ""
    """Why these ops run in the backward when that is not differentiation: recomputation."""
    gradient: str = ""
    """With the backward split (`trace_backward`): ``input`` for the ops on the way to the
    inputs' gradients, ``weight`` for those on the way to the parameters' only."""


def trace_backward(program: torch.export.ExportedProgram, graph: GraphRead,
                   received: dict | None = None, measured: dict | None = None,
                   split: bool = False) -> list[BackwardOps]:
    """The backward ops of every forward node of ``graph`` (the program's graph, read) that
    needs and receives a gradient. ``received``, when given, is filled with node -> whether
    every output of it that needs a gradient receives one. ``measured``: the example's value
    of each size read from values, for a backward kernel that needs concrete sizes.

    ``split``: the backward as torch's zero-bubble pipeline schedules run it, in two passes
    (torch/distributed/pipelining/_backward.py): ``stage_backward_input`` asks autograd for
    the gradients of the inputs only, so each op on their way differentiates for its operands
    that depend on an input needing a gradient (``gradient="input"``); ``stage_backward_weight``
    then asks for the parameters' from the gradients saved on that way, so each op
    differentiates for its other operands, those computed from parameters alone
    (``weight``). An op with operands of both kinds is replayed once for each: its two
    halves are what the two passes dispatch (a linear's two ``mm``s; ``native_layer_norm_
    backward`` once with the input's mask, once with the weight's and bias's). A model with
    no input that needs a gradient (token ids) has only the weight half."""
    signature = program.graph_signature
    flow = _Flow(Tracer(graph.shape_env, graph.renames, graph.kinds, measured), graph.nodes,
                 {*signature.inputs_to_parameters, *signature.inputs_to_buffers}, split)
    flow.run(program.graph, user_outputs(program))
    if received is not None:
        received.update({node: needs <= flow.receives.get(node, set())
                         for node, needs in flow.needs.items()})
    return [ops for call in graph.nodes for ops in flow.backward_of(call)]


class _Flow:
    """Which nodes need a gradient (forward, asking autograd op by op) and receive one
    (backward, from the outputs), through the subgraphs of run-once wrappers, whose ops autograd
    records as if unwrapped (autocast, grad mode, checkpointing)."""

    def __init__(self, tracer: Tracer, forward: list[NodeCall], lifted: set[str],
                 split: bool = False) -> None:
        self.tracer = tracer
        self.lifted = lifted
        """Names of the placeholders that hold parameters and buffers."""
        self.split = split
        """Whether each op's backward is traced in its input and weight halves."""
        self.forward = forward
        self.calls = {call.node: call for call in forward if call.node is not None}
        self.needs: dict[torch.fx.Node, frozenset[int]] = {}
        """Node -> indices of its outputs that need a gradient ({0} for one tensor)."""
        self.receives: dict[torch.fx.Node, set[int]] = {}
        """Node that needs a gradient -> indices of its outputs that receive one."""
        self.from_inputs: dict[torch.fx.Node, frozenset[int]] = {}
        """Node -> indices of its outputs that need a gradient and depend on an input (not a
        parameter or buffer) that needs one: on the way to the inputs' gradients."""
        self.autocast: dict[torch.fx.Node, tuple] = {}
        """Node inside a ``wrap_with_autocast`` -> that wrapper's autocast arguments."""
        self.bodies: dict[torch.fx.Node, tuple[torch.fx.Graph, list, list]] = {}
        """Wrapper traced through -> (subgraph, its operands, the subgraph's placeholders)."""
        self.kinds: dict[torch.fx.Node, str] = {}
        """Higher-order op -> how the backward treats it (see `_kind`)."""
        self.current: dict[tuple[torch.fx.Node, torch.fx.Node], torch.fx.Node] = {}
        """(user, input) -> the in-place op whose result the user reads there
        (`graph.writes.current_values`), for each graph the forward pass went through."""

    def run(self, graph: torch.fx.Graph, outputs: set[str]) -> None:
        for node in graph.nodes:
            if node.op == "placeholder" and getattr(example_value(node), "requires_grad", False):
                self.needs[node] = frozenset({0})
                if node.name not in self.lifted:
                    self.from_inputs[node] = frozenset({0})
        self._forward_pass(graph, None)
        if self.split:
            self._check_single_uses(graph)
        output = graph.output_node()
        for arg in input_nodes(output):
            if arg.name in outputs:
                self._receive(self._current(output, arg), 0)
        self._backward_pass(graph)

    def _forward_pass(self, graph: torch.fx.Graph, autocast: tuple | None) -> None:
        self.current.update(current_values(graph))
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            if autocast is not None:
                self.autocast[node] = autocast
            if node.target is operator.getitem:
                if node.args[1] in self.needs.get(node.args[0], ()):
                    self.needs[node] = frozenset({0})
                if node.args[1] in self.from_inputs.get(node.args[0], ()):
                    self.from_inputs[node] = frozenset({0})
            elif any(arg in self.needs for arg in self._inputs(node)):
                outputs = self._outputs_needing(node, autocast)
                if outputs:
                    self.needs[node] = outputs
                if outputs and node not in self.from_inputs and any(
                        self.from_inputs.get(arg) for arg in self._inputs(node)):
                    self.from_inputs[node] = outputs

    def _check_single_uses(self, graph: torch.fx.Graph) -> None:
        """With the backward split, each parameter reaches the way to the inputs' gradients at
        one op. torch's weight pass restarts from those ops with the gradients the input pass
        saved there (``get_param_groups``); from two or more (a parameter used twice: shared
        layers, a tied embedding and head in one call) autograd recomputes the input-gradient
        ops between them in the weight pass too, which this count does not model."""
        for parameter in graph.nodes:
            if parameter.op != "placeholder" or parameter not in self.needs \
                    or parameter in self.from_inputs:
                continue
            reached, seen, stack = set(), set(), [parameter]
            while stack:
                for user in stack.pop().users:
                    if user in seen:
                        continue
                    seen.add(user)
                    if self.from_inputs.get(user):
                        reached.add(user)
                    elif user in self.needs:
                        stack.append(user)
            if len(reached) > 1:
                raise InputError(
                    f"parameter {parameter.name} is used at {len(reached)} ops on the way to "
                    f"the inputs' gradients ({', '.join(sorted(n.name for n in reached))}): "
                    f"torch's weight pass then recomputes the input-gradient ops between them, "
                    f"which split_backward does not model; analyze without split_backward")

    def _outputs_needing(self, node: torch.fx.Node, autocast: tuple | None) -> frozenset[int]:
        """Autograd decides: ``detach``, comparisons, ``argmax``, ``zeros_like``... return
        outputs that need no gradient. An op that cannot be replayed is assumed to pass one on
        from every floating output (its backward is then reported untraced)."""
        if isinstance(node.target, HigherOrderOperator):
            return self._wrapper_outputs(node, autocast)
        if self._in_custom_function(node):
            # Autograd never sees these ops: the Function's outputs need a gradient when any of
            # its inputs does, whatever runs between (a straight-through estimator's comparison).
            val = example_value(node)
            return frozenset(range(len(val))) if isinstance(val, (list, tuple)) else frozenset({0})
        if isinstance(node.target, OpOverload):
            try:
                return self.tracer.outputs_needing(node, self._grad_positions(node), autocast)
            except Exception:  # any op may refuse a fake replay; its backward says why
                pass
        return floating_outputs(example_value(node))

    def _wrapper_outputs(self, node: torch.fx.Node, autocast: tuple | None) -> frozenset[int]:
        kind = self._kind(node)
        if kind == "no_grad":
            return frozenset()
        if kind == "flex":
            self._score_mod_forward(node, autocast)
            return floating_outputs(example_value(node))
        if kind not in ("through", "checkpoint"):
            return floating_outputs(example_value(node))
        (subgraph, operands, placeholders) = self.bodies[node]
        for placeholder, operand in zip(placeholders, operands):
            if operand in self.needs:
                self.needs[placeholder] = frozenset({0})
            if self.from_inputs.get(operand):
                self.from_inputs[placeholder] = frozenset({0})
        if node.target.name() == "wrap_with_autocast":
            autocast = tuple(node.args[:4])  # device type, dtype, enabled, cache_enabled
        self._forward_pass(subgraph, autocast)
        outputs = output_values(subgraph)
        self.from_inputs[node] = frozenset(i for i, out in enumerate(outputs)
                                           if self.from_inputs.get(out))
        return frozenset(i for i, out in enumerate(outputs) if out in self.needs)

    def _kind(self, node: torch.fx.Node) -> str:
        """How the backward treats a higher-order op: ``through`` its subgraph op by op (and a
        ``checkpoint`` recomputes it too), ``no_grad`` (no gradient), ``function`` (the inlined
        forward of a custom autograd.Function), ``flex`` (flex attention: its backward kernel,
        and its ``score_mod`` op by op), ``gather`` (the index in a ``score_mod``) or
        ``opaque`` (control flow)."""
        if node not in self.kinds:
            self.kinds[node] = self._classify(node)
        return self.kinds[node]

    def _classify(self, node: torch.fx.Node) -> str:
        name = node.target.name()
        if name == "flex_attention":
            return "flex"
        if name == "flat_apply" and applied_function(node) in GATHERS:
            return "gather"
        bodies = list(subgraphs(node))
        if name not in RUN_ONCE or len(bodies) != 1:
            return "opaque"
        subgraph = bodies[0][1]
        placeholders = [n for n in subgraph.nodes if n.op == "placeholder"]
        operands = [self._current(node, operand) for operand in wrapper_operands(node)]
        if len(placeholders) != len(operands):
            return "opaque"
        function = self._function_in(subgraph)
        if function and function not in CHECKPOINT_FUNCTIONS:
            return "function"
        if grad_off(node) and not function and not self._after_function(node):
            return "no_grad"
        if function and not self._checkpoint_tracks(operands):
            return "no_grad"
        self.bodies[node] = (subgraph, operands, placeholders)
        return "checkpoint" if name in CHECKPOINT_OPS or function else "through"

    def _score_mod_forward(self, node: torch.fx.Node, autocast: tuple | None) -> None:
        """Which ops of flex attention's ``score_mod`` need a gradient: it takes the score
        (computed from the query and key), four indices, then ``score_mod_other_buffers``
        (a learned bias); its output is the score the softmax reads."""
        score_mod = next(subgraphs(node))[1]
        placeholders = [n for n in score_mod.nodes if n.op == "placeholder"]
        buffers = list(input_nodes_of(node.args[7]))
        if len(placeholders) != SCORE_MOD_INDICES + 1 + len(buffers):
            return  # a layout this reading does not know: its ops' backward says so
        if any(arg in self.needs for arg in node.args[:2]):
            self.needs[placeholders[0]] = frozenset({0})
        if any(self.from_inputs.get(arg) for arg in node.args[:2]):
            self.from_inputs[placeholders[0]] = frozenset({0})
        for placeholder, buffer in zip(placeholders[SCORE_MOD_INDICES + 1:], buffers):
            if buffer in self.needs:
                self.needs[placeholder] = frozenset({0})
            if self.from_inputs.get(buffer):
                self.from_inputs[placeholder] = frozenset({0})
        self.bodies[node] = (score_mod, buffers, placeholders[SCORE_MOD_INDICES + 1:])
        self._forward_pass(score_mod, autocast)

    def _checkpoint_tracks(self, operands: list) -> bool:
        """Reentrant checkpointing tracks its outputs only when one of the tensors passed to
        ``checkpoint`` needs a gradient: parameters used inside do not count (torch warns "None
        of the inputs have requires_grad=True", and they get no gradient). Export passes both
        as operands; the lifted parameters and buffers are told apart by name. (Classified
        when the forward pass reaches the wrapper, so the operands' needs are known.)"""
        return any(operand in self.needs and operand.name not in self.lifted
                   for operand in operands)

    def _after_function(self, node: torch.fx.Node) -> bool:
        """Whether this grad-off wrapper is export's record of a custom Function's exit, not a
        ``no_grad`` of the model's. Export records a ``no_grad`` inside the Function's forward
        (reentrant checkpointing has one) and its exit, which restores the forward's own
        grad-off mode, but not the grad-on mode ``apply`` restores on return: the ops after
        the Function land in a grad-off wrapper of their own, right after the Function's."""
        previous = node.prev
        while previous.op != "root" and not grad_off(previous):
            previous = previous.prev
        return previous.op != "root" and bool(self._function_in(next(subgraphs(previous))[1]))

    def _in_custom_function(self, node: torch.fx.Node) -> bool:
        function = self.calls[node].autograd_function if node in self.calls else ""
        return bool(function) and function not in CHECKPOINT_FUNCTIONS

    def _function_in(self, subgraph: torch.fx.Graph) -> str:
        return next((self.calls[n].autograd_function for n in subgraph.nodes
                     if n in self.calls and self.calls[n].autograd_function), "")

    def _backward_pass(self, graph: torch.fx.Graph) -> None:
        for node in reversed(graph.nodes):
            if node.op != "call_function" or node not in self.receives:
                continue
            if node.target is operator.getitem:
                self._receive(node.args[0], node.args[1])
            elif self.kinds.get(node) == "flex":
                self._score_mod_backward(node)
            elif node in self.bodies:
                subgraph, operands, placeholders = self.bodies[node]
                outputs = output_values(subgraph)
                for index in self.receives[node]:
                    self._receive(outputs[index], 0)
                self._backward_pass(subgraph)
                for placeholder, operand in zip(placeholders, operands):
                    if placeholder in self.receives:
                        self._receive(operand, 0)
            else:
                for arg in self._inputs(node):
                    self._receive(arg, 0)

    def _score_mod_backward(self, node: torch.fx.Node) -> None:
        """The kernel's gradient reaches the query, key, value and buffers; the score's, the
        ``score_mod``'s output, and from it the ops that need one."""
        for arg in self._inputs(node):
            self._receive(arg, 0)
        if node in self.bodies:
            score_mod, buffers, placeholders = self.bodies[node]
            self._receive(output_values(score_mod)[0], 0)
            self._backward_pass(score_mod)
            for placeholder, buffer in zip(placeholders, buffers):
                if placeholder in self.receives:
                    self._receive(buffer, 0)

    def _receive(self, node: Any, index: int) -> None:
        if node in self.needs:
            self.receives.setdefault(node, set()).add(index)

    def _current(self, user: torch.fx.Node, read: torch.fx.Node) -> torch.fx.Node:
        """The node holding the value ``user`` reads where its graph names ``read``: the last
        in-place write into it through a view, if one ran since (`graph.writes`)."""
        return self.current.get((user, read), read)

    def _inputs(self, node: torch.fx.Node) -> list[torch.fx.Node]:
        return [self._current(node, arg) for arg in input_nodes(node)]

    def _grad_positions(self, node: torch.fx.Node) -> set[int]:
        flat = pytree.tree_leaves((node.args, node.kwargs))
        return {i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)
                and self._current(node, a) in self.needs and floating(example_value(a))}

    def backward_of(self, call: NodeCall) -> list[BackwardOps]:
        node = call.node
        outputs = self.receives.get(node)
        if outputs is None:
            return []
        if isinstance(node.target, HigherOrderOperator):
            if not self.split:
                return self._wrapper_backward(call)
            return [replace(ops, gradient=half,
                            calls=[replace(c, name=f"{c.name}.{half}") for c in ops.calls])
                    for ops in self._wrapper_backward(call)
                    for half in self._wrapper_halves(node)]
        if not isinstance(node.target, OpOverload):
            return []
        if self._in_custom_function(node):
            return [BackwardOps(call, [], custom_function_reason(call.autograd_function),
                                gradient=self._half(node))]
        return [self._op_backward(call, positions, outputs, gradient)
                for gradient, positions in self._halves(node)]

    def _halves(self, node: torch.fx.Node) -> list[tuple[str, set[int]]]:
        """(half, the operand positions it differentiates for): the whole backward, or with
        the split its input half (operands on the way to an input) and its weight half."""
        positions = self._grad_positions(node)
        if not self.split:
            return [("", positions)]
        flat = pytree.tree_leaves((node.args, node.kwargs))
        inputs = {i for i in positions if self.from_inputs.get(self._current(node, flat[i]))}
        return [(half, chosen) for half, chosen in (("input", inputs),
                                                    ("weight", positions - inputs)) if chosen]

    def _half(self, node: torch.fx.Node) -> str:
        """The half an op's backward runs in when it is not split by operand (a custom
        Function's): the input half when it is on the way to an input."""
        return "input" if self.from_inputs.get(node) else "weight"

    def _wrapper_halves(self, node: torch.fx.Node) -> list[str]:
        """The passes a wrapper's backward kernel runs in: it computes every operand's
        gradient at once (flex attention's kernel, a learned bias's too), so autograd runs it
        in the input pass when an operand is on the way to an input, and again in the weight
        pass when another is computed from parameters alone."""
        operands = [a for a in self._inputs(node) if a in self.needs]
        halves = ["input"] * any(self.from_inputs.get(a) for a in operands)
        return halves + ["weight"] * any(not self.from_inputs.get(a) for a in operands)

    def _op_backward(self, call: NodeCall, positions: set[int], outputs: set[int],
                     gradient: str) -> BackwardOps:
        try:
            ops = self.tracer.backward_of(call.node, positions, outputs,
                                          self.autocast.get(call.node))
        except Exception as error:  # any op may refuse a fake replay; the report says which
            return BackwardOps(call, [], f"{type(error).__name__}: {error}", gradient=gradient)
        suffix = f".{gradient}" if gradient else ""
        return BackwardOps(call, [backward_call(call, i, op, suffix)
                                  for i, op in enumerate(ops)], gradient=gradient)

    def _wrapper_backward(self, call: NodeCall) -> list[BackwardOps]:
        kind = self._kind(call.node)
        if kind == "flex":
            kernel = BackwardOps(call, [flex_backward(call, self.receives[call.node])])
            if call.node in self.bodies:
                return [kernel]
            prefix = f"{call.name}.{next(subgraphs(call.node))[0]}."
            return [kernel, *(BackwardOps(inner, [], SCORE_MOD_LAYOUT_REASON)
                              for inner in self.forward if inner.name.startswith(prefix))]
        if kind == "gather":
            return [BackwardOps(call, [gather_backward(call)])]
        if kind == "function":
            function = self._function_in(next(subgraphs(call.node))[1])
            return [BackwardOps(call, [], custom_function_reason(function))]
        if kind == "opaque" and call.node.target.name() == "flat_apply":
            return [BackwardOps(call, [], flat_apply_reason(applied_function(call.node)))]
        if kind == "opaque":
            return [BackwardOps(call, [], CONTROL_FLOW_REASON)]
        if kind == "checkpoint" and self.split:
            raise InputError(
                f"node {call.name} in module {call.module or '(root)'} is an activation "
                f"checkpoint: with the backward in two passes torch refuses a reentrant one "
                f"(torch.utils.checkpoint: incompatible with .grad()), and a non-reentrant one "
                f"recomputes its region in each pass that unpacks it, which this count does "
                f"not model; analyze without split_backward, or without checkpointing")
        if kind == "checkpoint":
            prefix = f"{call.name}."
            return [BackwardOps(inner, [replace(inner, name=f"{inner.name}.recompute")],
                                note=RECOMPUTED)
                    for inner in self.forward if inner.name.startswith(prefix)]
        return []
