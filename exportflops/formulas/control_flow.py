"""Control-flow ops (torch.cond, map, while_loop): free themselves; the walker reads their
subgraphs and counts each op inside as its own node (see walk._iterations for how often)."""

from __future__ import annotations

import torch

from .registry import FORMULAS

FORMULAS.register_zero(
    [torch.ops.higher_order.cond, torch.ops.higher_order.map_impl,
     torch.ops.higher_order.while_loop],
    "control flow: the ops of its subgraphs are counted as their own nodes",
    moves="nothing",
)
