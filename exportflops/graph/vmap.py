"""How many times an op under ``torch.vmap`` runs: export (pre-dispatch) records the vmapped
function's ops on one sample's shapes, between ``_add_batch_dim`` and ``_remove_batch_dim``
(torch.vmap, transformers' vmapped mask functions). Each runs batched, once per element of every
vmap level its inputs are batched at; an op on unbatched tensors only (a weight's transform)
runs once."""

from __future__ import annotations

import math
from typing import Any

import torch.fx

from ..torch_internals import predispatch


class VmapLevels:
    """Reads a graph's nodes in order: the open vmap levels and which values they batch."""

    def __init__(self, size: Any) -> None:
        self.size = size
        """Reads a batch size (an int, or a symbolic size) as the counts write it."""
        self.open: list[Any] = []
        """The batch size of each open level; level k (from 1) at index k - 1."""
        self.batched: dict[torch.fx.Node, frozenset[int]] = {}
        """Node -> the levels its value is batched at."""

    def runs(self, node: torch.fx.Node) -> Any:
        """Times ``node`` runs per call of the graph: the product of the batch sizes of the
        levels its inputs are batched at (1 outside vmap)."""
        target = node.target
        if target is predispatch._vmap_increment_nesting:
            batch = node.args[0]
            self.open.append(self.size(batch.meta["val"] if isinstance(batch, torch.fx.Node)
                                       else batch))
            return 1
        if target is predispatch._vmap_decrement_nesting:
            if self.open:  # a subgraph may close a level its caller opened
                self.open.pop()
            return 1
        levels = frozenset().union(*(self.batched.get(arg, frozenset())
                                     for arg in node.all_input_nodes))
        if target is predispatch._add_batch_dim:
            levels |= {node.args[2]}
        elif target is predispatch._remove_batch_dim:
            levels -= {node.args[1]}
        if levels:
            self.batched[node] = levels
        return math.prod(self.open[level - 1] for level in levels if level <= len(self.open))
