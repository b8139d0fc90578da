"""What the backward tracer reads of an fx graph's structure: a wrapper's operands, a node's
input nodes, a graph's outputs and a program's user outputs, which values are floating, a
``flat_apply``'s function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

from torch.export.graph_signature import OutputKind

from ..torch_internals import HigherOrderOperator, pytree


def applied_function(node: torch.fx.Node) -> str:
    """The qualified name of the function a ``flat_apply`` calls, as the graph names it."""
    return next((a for a in node.args if isinstance(a, str)), "a function")


def grad_off(node: torch.fx.Node) -> bool:
    return (isinstance(node.target, HigherOrderOperator)
            and node.target.name() == "wrap_with_set_grad_enabled" and node.args[0] is False)


def wrapper_operands(node: torch.fx.Node) -> list:
    """The values a wrapper passes to its subgraph's placeholders: the nodes after the
    subgraph's own ``get_attr`` argument."""
    flat = pytree.tree_leaves((node.args, node.kwargs))
    start = next(i for i, a in enumerate(flat)
                 if isinstance(a, torch.fx.Node) and a.op == "get_attr") + 1
    return [a for a in flat[start:] if isinstance(a, torch.fx.Node)]


def output_values(graph: torch.fx.Graph) -> list:
    return list(pytree.tree_leaves(graph.output_node().args[0]))


def floating_outputs(val: Any) -> frozenset[int]:
    values = val if isinstance(val, (list, tuple)) else [val]
    return frozenset(i for i, v in enumerate(values) if floating(v))


def input_nodes(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    return input_nodes_of((node.args, node.kwargs))


def input_nodes_of(args: Any) -> Iterator[torch.fx.Node]:
    return (a for a in pytree.tree_leaves(args) if isinstance(a, torch.fx.Node))


def floating(val: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
               for v in pytree.tree_leaves(val))


def user_outputs(program: torch.export.ExportedProgram) -> set[str]:
    return {spec.arg.name for spec in program.graph_signature.output_specs
            if spec.kind == OutputKind.USER_OUTPUT and hasattr(spec.arg, "name")}
