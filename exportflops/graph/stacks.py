"""Module stacks of graph nodes: which module calls an op ran in, from ``nn_module_stack``.

An ``invoke_subgraph`` body (a ``torch.compiler.nested_compile_region``) is one graph for all
its calls, and its nodes keep the stack of the call dynamo traced first, under dynamo's
``_export_root``: `invoked_stacks` moves them under each calling module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx

from ..records.names import qualified_name


@dataclass(frozen=True)
class ModuleFrame:
    """One entry of a node's module stack, outermost first."""

    path: str
    """Module path as ``named_modules()`` names it; ``""`` is the root."""
    type_name: str
    call_key: str
    """Export's key for this call of the module: ``l`` for the first call, ``l@1`` for the
    second."""


Stack = tuple[ModuleFrame, ...]

#: Export's placeholder stack for nodes its own passes insert (torch/_export/passes/
#: _node_metadata_hook.py); such nodes belong to the root.
_EXPORT_PLACEHOLDER_STACK = "_empty_nn_module_stack_from_metadata_hook"


def module_stack(node: torch.fx.Node) -> Stack:
    stack = node.meta.get("nn_module_stack") or {}
    return tuple(_frame(path, type_, key) for key, (path, type_) in stack.items()
                 if key != _EXPORT_PLACEHOLDER_STACK)


def invoked_stacks(body: torch.fx.Graph, caller: Stack) -> Callable[[Stack], Stack]:
    """How the stack of a node of the ``body`` reads for the call made from ``caller``.

    The body's frames down to the called module (the deepest frame all its nodes share whose
    class is the caller's innermost module's) are the first call's; the frames below it are
    modules inside the region, kept under the calling module's path. A body whose frames do
    not show the called module is charged to the caller."""
    stacks = [s for s in (module_stack(n) for n in body.nodes if n.op == "call_function") if s]
    shared = _shared_prefix(stacks)
    inner = caller[-1] if caller else None
    called = next((i for i in reversed(range(len(shared)))
                   if inner is not None and shared[i].type_name == inner.type_name), None)

    def rebased(stack: Stack) -> Stack:
        if called is None:
            return caller
        root = shared[called].path
        return caller + tuple(
            ModuleFrame(inner.path + f.path[len(root):], f.type_name,
                        f"{inner.call_key}/{f.call_key}") for f in stack[called + 1:])
    return rebased


def _shared_prefix(stacks: list[Stack]) -> Stack:
    if not stacks:
        return ()
    shared = stacks[0]
    for stack in stacks[1:]:
        n = next((i for i, (a, b) in enumerate(zip(shared, stack)) if a != b),
                 min(len(shared), len(stack)))
        shared = shared[:n]
    return shared


@functools.lru_cache(maxsize=None)
def _frame(path: str, type_: Any, key: str) -> ModuleFrame:
    # Every node of a module repeats its frames; frozen, so one object per frame.
    return ModuleFrame(path, _type_name(type_), key)


def _type_name(type_: Any) -> str:
    return type_ if isinstance(type_, str) else qualified_name(type_)
