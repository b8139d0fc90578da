"""Embedding lookups: no arithmetic; the bytes are the rows gathered, not the whole table."""

from __future__ import annotations


from ..graph.opcall import bytes_by_kind
from .registry import FORMULAS, Cost, OpCall, aten_ops, register_formula, aten


#: EmbeddingBag's ``mode`` argument: 0 sum, 1 mean, 2 max (torch.nn.functional.embedding_bag).
MEAN, MAX = 1, 2


@register_formula(aten.embedding)
def embedding(call: OpCall) -> Cost:
    weight, indices, out = call["weight"], call["indices"], call.out
    # The rows gathered are read from the table (a weight): out.nbytes of it.
    return Cost(**bytes_by_kind([(indices, indices.nbytes), (weight, out.nbytes)],
                                [(out, out.nbytes)]))


@register_formula(aten.embedding_bag, aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag(call: OpCall) -> Cost:
    weight, indices, out = call["weight"], call["indices"], call.outputs[0]
    width = weight.shape[-1]
    gathered = indices.numel * width
    weighted = gathered if call.get("per_sample_weights") is not None else 0
    # Combining n rows into one bag takes n - 1 adds (or compares) per column; rounded up to n,
    # as `reduce.reduction` counts; mean divides once per output element.
    flops = gathered + weighted + (out.numel if call.get("mode", 0) == MEAN else 0)
    rows = [(indices, indices.nbytes), (weight, gathered * weight.dtype.itemsize)]
    return Cost(flops=flops, **bytes_by_kind(rows, [(out, out.nbytes)]))


FORMULAS.register_value_dependent(
    aten_ops("embedding_renorm", in_place=True),
    "(an embedding's max_norm) rescales the distinct rows the indices select whose norm "
    "exceeds max_norm: how many, the indices' and the weights' values decide",
)
