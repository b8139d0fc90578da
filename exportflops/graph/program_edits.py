"""Edits `generation` makes to an exported decode step before it is counted: the cache length
named, and transformers' rebuild of the cache from its input tensors removed."""

from __future__ import annotations

from collections.abc import Iterable

from typing import Any

import torch


def user_inputs(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The placeholders of the program's tensor user inputs, flattened, constants left out."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [placeholders[n] for n in program.graph_signature.user_inputs if n in placeholders]


def name_input_sizes(program: torch.export.ExportedProgram, positions: Iterable[int], dim: int,
                     name: str) -> None:
    """Name the dynamic size at ``dim`` of each of the program's tensor inputs at
    ``positions`` (flattened order, constants left out) ``name``, as a ``torch.export.Dim``
    would; static sizes are left alone. For sizes exported as ``Dim.DYNAMIC``: a named Dim is
    refused when torch cannot prove a guard over its whole range (the cache length's stride
    guards, ``min(8 + 8*s, 16 + 16*s)``), though the graph is the same. Sizes the model does
    not tie together (each layer's cache length in a model that reads only the first layer's)
    stay separate symbols in torch and all take ``name``: one size in the counts."""
    inputs = user_inputs(program)
    for position in positions:
        value = inputs[position].meta["val"]
        size = value.shape[dim]
        if not isinstance(size, torch.SymInt):
            continue
        shape_env = value.fake_mode.shape_env
        for source in shape_env.var_to_sources[size.node.expr]:  # after replacements
            shape_env.source_name_to_debug_name[source.name] = name


def drop_cache_rebuild(program: torch.export.ExportedProgram, positions: range) -> list[str]:
    """Remove the copies that rebuild a KV cache from its input tensors; their names.

    A copy is a ``cat`` of one cache input (user input at one of ``positions``, flattened,
    constants left out) with only empty tensors, of that input's dtype: its value is the input.
    Its uses read the input instead; it and the empty tensors that only it used are erased."""
    graph = program.graph
    inputs = user_inputs(program)
    cache = {inputs[i] for i in positions}
    dropped = []
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.cat.default:
            continue
        full = [t for t in node.args[0] if not _is_empty(t.meta["val"])]
        if (len(full) != 1 or full[0] not in cache
                or node.meta["val"].dtype != full[0].meta["val"].dtype):
            continue
        node.replace_all_uses_with(full[0])
        dead = {t for t in node.args[0] if t is not full[0]}
        graph.erase_node(node)
        dropped.append(node.name)
        while dead:  # the empty tensors (and what made them) nothing else reads
            arg = dead.pop()
            if arg.op == "call_function" and not arg.users and _is_empty(arg.meta["val"]):
                dead.update(arg.all_input_nodes)
                graph.erase_node(arg)
    program.graph_module.recompile()
    return dropped


def _is_empty(value: Any) -> bool:
    return any(isinstance(size, int) and size == 0 for size in value.shape)
