"""The parts a training-FLOPs count is split into, on both sides of a comparison.

A stack's formula returns its FLOPs per part (`registry.StackFormula`); the graph's count is
split into the same parts here (`graph_parts`), so that the difference of each part is one
named term and the terms add up to the whole difference by construction. A part the graph
and a formula agree on has term 0: that is the check that can fail (``projections`` is 0 when
every projection weight enters one matmul per token, forward, and two in the backward).

Parameters are grouped from the report's module records (`param_groups`), never from the
model, so a saved report is enough: nn.Embedding tables, the output layer, norms (a module
type with ``Norm`` in its name), routed experts (a module named ``experts``, transformers'
fused expert weights), routers (a module named ``gate``) and the rest, the projections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..count.backward import RECOMPUTED
from ..records import FLOPS_PER_MAC, Report

#: Every part, with what a difference in it means (the reason a term row prints).
PARTS: dict[str, str] = {
    "projections": "the blocks' projection weights (attention in/out, dense MLPs, shared "
                   "experts)",
    "router": "the MoE router's matmul",
    "experts": "routed experts: active (top-k of E) vs total experts",
    "norms_and_biases": "norm weights and projection biases counted as matmul parameters, 6 "
                        "FLOPs per token each",
    "embedding": "the token embedding: a gather, counted by some stacks as a matmul",
    "output_layer": "the output layer (LM head), tied or not",
    "attention": "attention's q.k and p.v matmuls: causal attention counted whole or half",
    "elementwise": "work outside matmuls (norm statistics, softmax, activations, residuals, "
                   "rotary, loss, the embedding's gradient scatter) that no formula counts",
    "backward": "the backward as one part: DeepSpeed takes it as 2 x the forward it counts "
                "(its profiler sees the forward only), the graph counts the backward's ops",
    "recompute": "the nodes the report records as recomputed (reentrant activation "
                 "checkpointing), which MFU leaves out",
    "padding": "work on padded positions: the other parts are the graph as it runs (padded), "
               "the exact count leaves padding out",
}

#: Last module-name segments that are attention modules themselves: a matmul there (not in a
#: projection child) is q.k or p.v (transformers' math SDPA backward runs as bmm in it).
ATTENTION_MODULES = frozenset({"self_attn", "attn", "attention"})


@dataclass(frozen=True)
class ParamGroups:
    """Parameters by group, read off a report's modules (each parameter once, tied ones at
    the module that owns them)."""

    embedding: int
    """nn.Embedding tables."""
    output_layer: int
    """The output layer's own weight: 0 when tied to the embedding."""
    output_tied: bool
    """The output layer multiplies by the embedding's table."""
    norms: int
    """Weights (and biases) of norm modules."""
    biases: int
    """Biases of the projections (a linear node's third input, once per module)."""
    experts: int
    """Routed experts' weights, every expert."""
    router: int
    """MoE routers' weights."""
    projections: int
    """Every other parameter: the blocks' projection weights, shared experts."""
    head_width: int
    """V x d of the output layer, tied or not: what its matmul multiplies by."""
    output_path: str
    """The output layer's module path (`output_module`)."""

    @property
    def total(self) -> int:
        return (self.embedding + self.output_layer + self.norms + self.biases + self.experts
                + self.router + self.projections)


def _kind(path: str, type_name: str, head: str) -> str:
    last = path.rpartition(".")[2]
    if path == head:
        return "output_layer"
    if type_name.endswith(".Embedding"):
        return "embedding"
    if "Norm" in type_name.rpartition(".")[2]:
        return "norms"
    if last == "experts":
        return "experts"
    if last == "gate":
        return "router"
    return "projections"


def output_module(report: Report) -> str:
    """The output layer's path: transformers' ``lm_head``, or torchtitan's ``output``."""
    paths = {m.path for m in report.modules}
    for name in ("lm_head", "output"):
        if name in paths:
            return name
    raise KeyError(f"{report.model} has no module lm_head or output: the stacks' formulas are "
                   f"for causal language models with an output layer")


def param_groups(report: Report) -> ParamGroups:
    """The report's parameters by group (module docstring)."""
    head = output_module(report)
    sums = dict.fromkeys(("embedding", "output_layer", "norms", "experts", "router",
                          "projections"), 0)
    for module in report.modules:
        sums[_kind(module.path, module.type, head)] += module.own_params
    biases = _projection_biases(report, head)
    sums["projections"] -= biases
    tied = any(t.name.startswith(f"{head}.") for t in report.tied_parameters)
    width = sums["embedding"] if tied else sums["output_layer"]
    return ParamGroups(**sums, biases=biases, output_tied=tied, head_width=width,
                       output_path=head)


def _projection_biases(report: Report, head: str) -> int:
    """Elements of the bias each projection's linear node adds (its third input), once per
    module: a module's record counts its parameters, not which of them is a bias."""
    seen: dict[str, int] = {}
    for node in report.nodes:
        if (node.phase == "forward" and node.op.startswith("aten.linear") and len(node.inputs) == 3
                and node.module not in seen):
            seen[node.module] = math.prod(node.inputs[2].shape)
    kinds = {m.path: _kind(m.path, m.type, head) for m in report.modules}
    return sum(n for module, n in seen.items() if kinds.get(module) == "projections")


def matmul_part(module: str, op: str, head: str) -> str:
    """The part of the matmul FLOPs of op ``op`` run in module ``module``, ``head`` the output
    layer's path."""
    last = module.rpartition(".")[2]
    if module == head:
        return "output_layer"
    if "attention" in op or last in ATTENTION_MODULES:
        return "attention"
    if last == "experts":
        return "experts"
    if last == "gate":
        return "router"
    return "projections"


def graph_parts(report: Report, backward_whole: bool = False) -> dict[str, int]:
    """The report's FLOPs (forward and backward) by part: matmuls (2 per MAC) by the module
    they run in, embedding lookups and their gradients whole, the rest ``elementwise``, and
    nodes activation checkpointing recomputes ``recompute``; with ``backward_whole`` every
    other backward node in ``backward`` (to compare with a stack that multiplies its forward).
    The parts sum to ``report.total.flops``."""
    head = output_module(report)
    parts = dict.fromkeys(PARTS, 0)
    for node in report.nodes:
        cost = node.cost
        if node.note.startswith(RECOMPUTED):
            parts["recompute"] += cost.flops
        elif backward_whole and node.phase == "backward":
            parts["backward"] += cost.flops
        elif node.op.startswith("aten.embedding"):
            parts["embedding"] += cost.flops
        else:
            matmul = FLOPS_PER_MAC * cost.macs
            parts[matmul_part(node.module, node.op, head)] += matmul
            parts["elementwise"] += cost.flops - matmul
    return parts
