"""Ops with no formula of their own, counted through torch's decomposition of them.

An alias or composite (``multiply`` is ``mul``, ``outer`` a view and a ``mul``, ``mse_loss`` a
subtract, a square and a mean) is replayed on fake tensors of the node's layouts, under a fake
mode sharing the graph's shape env, and the ATen ops it runs are counted by the formula table.
Its decomposition is, in order: the op's CompositeImplicitAutograd kernel (what eager runs), else
its entry in ``torch._decomp``'s table. An op the replay meets that has no formula is itself
decomposed the same way; one with neither stays uncounted, and so does the node.

The cost is the sum of what the decomposition runs, its intermediates' traffic included. A
decomposition that branches on a dynamic size (a new guard in the shape env) would fix its count
at the example size: such a node is reported uncounted with that reason.

A composite that has a built-in formula (``matmul``, ``linear``) is counted through its
decomposition too where that runs an op the user gave a formula for: export's graph keeps
``aten.matmul`` where the dispatcher, and so a dispatch-level counter, sees ``aten.mm``, and a
formula given for ``aten.mm`` is meant for every matrix product that runs one.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..formulas.registry import FormulaTable
from ..graph.opcall import OpCall, TensorMeta
from ..records import Cost
from .replay import Recorder, _fresh, _layout, fake_replay
from ..torch_internals import (
    OpOverload, decomposition_table, dispatch_has_kernel, dispatch_has_kernel_for_dispatch_key,
    pytree,
)
from ..graph.walk import example_value, NodeCall, op_name


def decomposition(op: Any) -> Any:
    """The function torch decomposes ``op`` with, or None: its CompositeImplicitAutograd kernel,
    else its ``torch._decomp`` entry."""
    if not isinstance(op, OpOverload):
        return None
    if composite(op):
        return op.decompose
    return decomposition_table.get(op)


@functools.cache
def composite(op: Any) -> bool:
    """Whether ``op`` has a CompositeImplicitAutograd kernel: eager runs it as the ops it
    calls, which is all a dispatch-level counter (``FlopCounterMode``) sees of it."""
    # TorchScript's prim ops (prim::device) are not in the dispatcher: no kernel to ask about.
    return (isinstance(op, OpOverload) and dispatch_has_kernel(op.name())
            and dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"))


@dataclass(frozen=True)
class Outcome:
    """A decomposed node's status, cost and note, as `count_node` records them."""

    status: str
    cost: Cost
    note: str
    runs: frozenset = frozenset()
    """The ops the decomposition ran (each counted by its own formula)."""


class Decomposer:
    """Counts nodes through their decomposition; caches by op and input layouts."""

    def __init__(self, shape_env, renames: dict) -> None:
        self.shape_env = shape_env
        self.renames = renames
        self.cache: dict[tuple, Outcome] = {}
        self.gives: tuple[FormulaTable, bool] | None = None
        """The last table asked about, and whether it holds a user's formula."""

    def through_given(self, node: NodeCall, table: FormulaTable) -> Outcome | None:
        """The node counted through its decomposition where that runs an op whose formula in
        ``table`` is the user's (``formulas={aten.mm.default: ...}`` for a node of
        ``aten.matmul``); None otherwise, and the node's own formula counts it."""
        if self.gives is None or self.gives[0] is not table:
            self.gives = (table, table.any_given())
        # Only what eager decomposes before dispatch: a dispatch-level formula never sees a
        # composite's call, while an op with a kernel (gelu) is one call there as here.
        if not self.gives[1] or not composite(node.op):
            return None
        outcome = self.count(node, table)
        given = sorted(op_name(op) for op in outcome.runs if table.given(op)) \
            if outcome is not None else []
        if not given:
            return None
        return replace(outcome, note=f"{outcome.note} (the formula given for "
                                     f"{', '.join(given)})")

    def count(self, node: NodeCall, table: FormulaTable) -> Outcome | None:
        """The node counted through its decomposition; None when ``op`` has none."""
        function = decomposition(node.op)
        if function is None:
            return None
        values = _values(node)
        if values is None:
            return Outcome("uncounted", Cost(), "no formula; its decomposition is traced only "
                           "for a graph node or an op of concrete sizes")
        key = (node.op, tuple(_layout(v, False) for v in pytree.tree_leaves(values)))
        if key not in self.cache:
            self.cache[key] = self._count(node.op, function, values, table)
        return self.cache[key]

    def _count(self, op: Any, function: Any, values: tuple, table: FormulaTable) -> Outcome:
        guards = len(self.shape_env.guards) if self.shape_env is not None else 0
        recorder = _Expanding(self.renames, table, op)
        try:
            with fake_replay(self.shape_env, grad=False, allow_non_fake_inputs=True):
                tensors = pytree.tree_map_only(TensorMeta, _empty, values)
                args, kwargs = pytree.tree_map_only(torch.Tensor, _fresh, tensors)
                with recorder:
                    result = function(*args, **kwargs)
        except Exception as error:  # torch's own decompositions may refuse fake or symbolic input
            return Outcome("uncounted", Cost(), f"no formula; its decomposition could not be "
                           f"traced ({type(error).__name__}: {error})")
        if result is NotImplemented:
            return Outcome("uncounted", Cost(), "no formula; its decomposition does not apply "
                           "to these arguments")
        if self.shape_env is not None and len(self.shape_env.guards) > guards:
            branches = ", ".join(str(g.expr) for g in self.shape_env.guards[guards:])
            return Outcome("uncounted", Cost(), f"no formula; its decomposition branches on "
                           f"dynamic sizes ({branches}), so no one count holds for every size")
        return _summed(recorder.calls, table)


def _summed(calls: list[OpCall], table: FormulaTable) -> Outcome:
    """The decomposition's ops counted by the table (each has an entry, or none at all)."""
    into = _listed(calls)
    cost, missing, zero = Cost(), {}, True
    for call in calls:
        entry = table.lookup(call.op)
        if entry is None:
            missing[op_name(call.op)] = table.value_dependence(call.op)
            continue
        try:
            cost = cost + entry.formula(call)
        except Exception as error:  # a user's formula may raise anything; the note says which
            return Outcome("error", Cost(), f"counted through its decomposition into {into}: "
                           f"{op_name(call.op)}: {type(error).__name__}: {error}",
                           frozenset(call.op for call in calls))
        zero = zero and entry.zero_reason is not None
    if missing:
        reasons = "".join(sorted({f"; {reason}" for reason in missing.values() if reason}))
        return Outcome("uncounted", Cost(), f"no formula; its decomposition into {into} runs "
                       f"{', '.join(sorted(missing))}, which has neither{reasons}")
    if not calls:
        return Outcome("zero", cost, "counted through its decomposition, which runs no op here")
    return Outcome("zero" if zero else "counted", cost,
                   f"counted through its decomposition into {into}",
                   frozenset(call.op for call in calls))


def _listed(calls: list[OpCall]) -> str:
    """``aten.view.default, aten.mul.Tensor x2``: each op once, in order, with its calls."""
    counts = Counter(op_name(call.op) for call in calls)
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


class _Expanding(Recorder):
    """Records each op that has a formula (or no decomposition); runs the decomposition of any
    other, once per op on the stack (a decomposition that calls its own op records it)."""

    def __init__(self, renames: dict, table: FormulaTable, top: Any) -> None:
        super().__init__(renames)
        self.table = table
        self.expanding = {top}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        function = None
        if self.table.lookup(func) is None and func not in self.expanding:
            function = decomposition(func)
        if function is not None:
            self.expanding.add(func)
            try:
                with self:
                    result = function(*args, **kwargs)
            finally:
                self.expanding.discard(func)
            if result is not NotImplemented:
                return result
        return super().__torch_dispatch__(func, types, args, kwargs)


def _values(node: NodeCall) -> tuple | None:
    """(args, kwargs) to replay: the graph node's own fake values, or for an op autograd ran
    (no node), empty tensors of its concrete shapes; None when a size is symbolic."""
    if node.node is not None:
        values = pytree.tree_map_only(torch.fx.Node, example_value,
                                      (node.node.args, node.node.kwargs))
        return tuple(values[0]), dict(values[1])
    schema = node.op._schema
    leaves = pytree.tree_leaves(dict(node.call.args))
    if any(isinstance(v, TensorMeta) and not all(isinstance(d, int) for d in v.shape)
           for v in leaves) or not all(isinstance(v, (TensorMeta, int, float, bool, str,
                                                      type(None), torch.dtype)) for v in leaves):
        return None
    args = tuple(node.call.args[a.name] for a in schema.arguments if not a.kwarg_only)
    kwargs = {a.name: node.call.args[a.name] for a in schema.arguments if a.kwarg_only}
    return args, kwargs


def _empty(meta: TensorMeta) -> torch.Tensor:
    return torch.empty(meta.shape, dtype=meta.dtype, device="meta")
