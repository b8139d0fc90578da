"""Control-flow and wrapper ops (torch.cond, map, scan, while_loop, grad-mode and autocast
regions, checkpointing): free themselves; the walker reads their subgraphs and counts each op
inside as its own node (see walk._iterations for how often each runs)."""

from __future__ import annotations

import torch

from ..graph.walk import CONTROL_FLOW
from .registry import FORMULAS, Cost, OpCall, register_formula
from ..torch_internals import higher_order_ops as _higher_order_ops

FORMULAS.register_zero(
    [getattr(torch.ops.higher_order, name) for name in sorted(CONTROL_FLOW)
     if name in _higher_order_ops],
    "control flow: the ops of its subgraphs are counted as their own nodes",
    moves="nothing",
)


#: Functions ``flat_apply`` may call that only gather elements (flex attention's and
#: transformers' mask functions index with ``ModIndex``, an ``aten.index`` with a backward).
GATHERS = ("torch._dynamo._trace_wrapped_higher_order_op.ModIndex",)


@register_formula(torch.ops.higher_order.flat_apply)
def flat_apply(call: OpCall) -> Cost:
    """``flat_apply(function, ...)`` calls a Python function export could not trace into; the
    graph names it by its qualified name. An index moves data only; any other function is not
    seen, and its cost is reported uncounted with its name."""
    names = [value for value in call.args.values() if isinstance(value, str)]
    if any(name in GATHERS for name in names):
        return call.cost()
    raise ValueError(f"flat_apply calls {names[0] if names else 'a function'} that the graph "
                     f"does not show; register a formula for flat_apply to count it")
