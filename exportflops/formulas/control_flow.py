"""Control-flow and wrapper ops (torch.cond, map, scan, while_loop, grad-mode and autocast
regions, checkpointing): free themselves; the walker reads their subgraphs and counts each op
inside as its own node (see walk._iterations for how often each runs)."""

from __future__ import annotations

import torch
from torch._ops import _higher_order_ops

from .registry import FORMULAS

#: Wrappers that run their subgraph exactly once per call (grad mode, autocast, checkpoint, ...).
RUN_ONCE = frozenset({"wrap", "wrap_with_set_grad_enabled", "wrap_with_autocast",
                      "wrap_activation_checkpoint", "tag_activation_checkpoint",
                      "invoke_subgraph", "hints_wrapper", "strict_mode"})

_CONTROL_FLOW = {"cond", "map_impl", "scan", "associative_scan", "while_loop", *RUN_ONCE}

FORMULAS.register_zero(
    [getattr(torch.ops.higher_order, name) for name in sorted(_CONTROL_FLOW)
     if name in _higher_order_ops],
    "control flow: the ops of its subgraphs are counted as their own nodes",
    moves="nothing",
)
