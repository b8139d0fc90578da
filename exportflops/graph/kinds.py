"""What each tensor of an exported graph holds, for bytes by kind: weight, state or activation.

From the graph signature: parameters, buffers and lifted constants are weights; a buffer (or a
user input) the graph mutates is state, as a KV cache is. The training IR keeps in-place ops
(``index_copy_`` on a cache buffer), so a placeholder written through an argument the op's schema
marks ``(a!)``, or through a view of it, is state too; a functional graph lists the new value of
each mutated buffer among its outputs instead, and the node computing it writes state. A view
(an op whose output the schema aliases to an input, ``Tensor(a)``) holds what its input holds:
reading ``t(weight)`` reads a weight. Everything else is an activation.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind

from .opcall import STATE, WEIGHT, bind_schema
from ..torch_internals import pytree

_WEIGHTS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION,
              OutputKind.PARAMETER_MUTATION)


def tensor_kinds(graph: torch.fx.Graph,
                 signature: ExportGraphSignature | None) -> dict[torch.fx.Node, str]:
    """``WEIGHT`` or ``STATE`` per node holding one; nodes absent here hold activations."""
    if signature is None:
        return {}
    nodes = {node.name: node for node in graph.nodes}
    mutated = {spec.target for spec in signature.output_specs if spec.kind in _MUTATIONS}
    kinds: dict[torch.fx.Node, str] = {}
    for spec in signature.input_specs:
        node = nodes.get(getattr(spec.arg, "name", None))
        if node is None:
            continue
        if spec.kind in _WEIGHTS:
            kinds[node] = STATE if spec.target in mutated else WEIGHT
        elif spec.kind == InputKind.USER_INPUT and spec.arg.name in mutated:
            kinds[node] = STATE
    kinds = _through_views(graph, kinds)
    for spec in signature.output_specs:
        if spec.kind in _MUTATIONS and spec.arg.name in nodes:
            kinds[nodes[spec.arg.name]] = STATE
    return kinds


def subgraph_kinds(node: torch.fx.Node, subgraph: torch.fx.Graph,
                   kinds: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
    """The kinds inside a control-flow op's ``subgraph``: its placeholders hold what the op's
    operands hold (the tensors after its last subgraph argument, in order: cond's operands, a
    wrapper's arguments, a scan's inputs). When they do not line up one to one (flex
    attention's score_mod takes scalars), everything inside is an activation."""
    positions = [i for i, arg in enumerate(node.args)
                 if isinstance(arg, torch.fx.Node) and arg.op == "get_attr"]
    rest = node.args[positions[-1] + 1:] if positions else ()
    operands = [leaf for leaf in pytree.tree_leaves(rest) if isinstance(leaf, torch.fx.Node)]
    placeholders = [n for n in subgraph.nodes if n.op == "placeholder"]
    if len(operands) != len(placeholders):
        return {}
    seeds = {p: kinds[o] for p, o in zip(placeholders, operands) if o in kinds}
    return _through_views(subgraph, seeds)


def _through_views(graph: torch.fx.Graph,
                   kinds: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
    """``kinds`` of the placeholders, with those written in place made state, carried to every
    view of them."""
    kinds = dict(kinds)
    aliases = {node: source for node in graph.nodes
               if (source := aliased_input(node)) is not None}
    for node in graph.nodes:
        for written in written_inputs(node):
            root = view_root(written, aliases)
            if root.op == "placeholder":  # a buffer, a parameter or a user input
                kinds[root] = STATE
    for node in graph.nodes:  # graph order: a view's source is classified before it
        source = aliases.get(node)
        if source is not None and source in kinds:
            kinds[node] = kinds[source]
    return kinds


def view_root(node: torch.fx.Node, aliases: dict[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node:
    """The node whose storage ``node`` views, following ``aliases`` (view -> its source)."""
    while node in aliases:
        node = aliases[node]
    return node


def _schema_args(node: torch.fx.Node) -> list[tuple[Any, Any]]:
    """(schema argument, fx value) of an op node; [] for a node without a schema."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None:
        return []
    bound = bind_schema(schema, node.args, node.kwargs)
    return [(argument, bound[argument.name]) for argument in schema.arguments]


def aliased_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input node a view (or an in-place op) returns an alias of, per its schema."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:  # an element of an aliasing op's list of views
        source = node.args[0]
        return source if isinstance(source, torch.fx.Node) else None
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    sets = schema.returns[0].alias_info.before_set
    for argument, value in _schema_args(node):
        if (argument.alias_info is not None and argument.alias_info.before_set & sets
                and isinstance(value, torch.fx.Node)):
            return value
    return None


def written_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Inputs an in-place op writes (schema ``(a!)``)."""
    return [value for argument, value in _schema_args(node)
            if argument.alias_info is not None and argument.alias_info.is_write
            and isinstance(value, torch.fx.Node)]
