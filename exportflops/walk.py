"""The only reader of ``node.meta``: one `NodeCall` per ``call_function`` node of an exported graph.

Tensor arguments become `TensorMeta` (shape + dtype from the FakeTensor in ``meta["val"]``),
arguments are named by the op's schema, and symbolic sizes pass through as sympy expressions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from .formulas.registry import OpCall, TensorMeta


@dataclass(frozen=True)
class ModuleFrame:
    """One entry of a node's module stack, outermost first."""

    path: str
    """Module path as ``named_modules()`` names it; ``""`` is the root."""
    type_name: str
    call_key: str
    """Export's key for this call of the module: ``l`` for the first call, ``l@1`` for the second."""


@dataclass(frozen=True)
class NodeCall:
    """A call_function node as the formulas and the attribution see it."""

    name: str
    op: Any
    op_name: str
    call: OpCall
    stack: tuple[ModuleFrame, ...]

    @property
    def module(self) -> str:
        return self.stack[-1].path if self.stack else ""


def walk(graph: torch.fx.Graph) -> Iterator[NodeCall]:
    for node in graph.nodes:
        if node.op == "call_function":
            yield NodeCall(node.name, node.target, op_name(node.target), _op_call(node),
                           _module_stack(node))


def op_name(target: Any) -> str:
    """``aten.mm.default`` for an OpOverload, ``getitem`` for a Python function."""
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        return f"{namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return getattr(target, "__name__", str(target))


def size_hints(graph: torch.fx.Graph) -> dict[sympy.Symbol, int]:
    """The example inputs' value of every symbolic size in the graph."""
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
            shape_env = val.fake_mode.shape_env
            if shape_env is None:
                return {}
            # torch >= 2.10 renamed var_to_val (kept as a deprecated alias) to backed_var_to_val.
            if hasattr(shape_env, "backed_var_to_val"):
                return dict(shape_env.backed_var_to_val)
            return dict(shape_env.var_to_val)
    return {}


def _op_call(node: torch.fx.Node) -> OpCall:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        named = {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    else:
        named = _bind(schema, node.args, node.kwargs)
    args = {name: _meta(value) for name, value in named.items()}
    return OpCall(node.target, args, tuple(_tensors(node.meta.get("val"))))


def _bind(schema: torch.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    named = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            named[argument.name] = args[i]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
        else:
            named[argument.name] = None
    return named


def _meta(value: Any) -> Any:
    """An fx argument as a formula sees it: tensors as TensorMeta, sizes as int or sympy."""
    if isinstance(value, torch.fx.Node):
        return _meta(value.meta.get("val"))
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(_size(d) for d in value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _size(value)
    return value


def _size(value: Any) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = value.node.expr
        if expr.is_number:
            return int(expr) if isinstance(value, torch.SymInt) else expr
        return expr
    return value


def _tensors(val: Any) -> Iterator[TensorMeta]:
    if isinstance(val, torch.Tensor):
        yield _meta(val)
    elif isinstance(val, (list, tuple)):
        for v in val:
            yield from _tensors(v)


def _module_stack(node: torch.fx.Node) -> tuple[ModuleFrame, ...]:
    stack = node.meta.get("nn_module_stack") or {}
    return tuple(ModuleFrame(path, _type_name(type_), key) for key, (path, type_) in stack.items())


def _type_name(type_: Any) -> str:
    return type_ if isinstance(type_, str) else f"{type_.__module__}.{type_.__qualname__}"
