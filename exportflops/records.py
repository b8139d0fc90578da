"""Every public record: strict pydantic models with a documented field each. Imports no torch.

A `Report` is plain data: it serializes to JSON and back (`Report.model_validate_json`), so a
saved report renders and queries without the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1

#: Keep in step with ``formulas.registry.FLOPS_PER_MAC`` (records must not import torch).
FLOPS_PER_MAC = 2


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Counts(Record):
    """Work of one node, module or model: FLOPs, MACs and bytes from tensor sizes x itemsize."""

    flops: int = 0
    """All floating-point operations: 2 per multiply-accumulate, 1 per pointwise output element
    unless the op's formula documents otherwise."""
    macs: int = 0
    """Multiply-accumulates of contractions (matmul, linear, einsum, conv, attention)."""
    bytes_read: int = 0
    """Bytes of the tensors the ops read, each input counted once per op."""
    bytes_written: int = 0
    """Bytes of the tensors the ops write."""
    masked_flops: int = 0
    """The part of ``flops`` spent on (query, key) pairs a causal mask discards."""
    masked_macs: int = 0
    """The part of ``macs`` spent on (query, key) pairs a causal mask discards."""

    @property
    def matmul_flops(self) -> int:
        """FLOPs of the matmul family alone: 2 per MAC (Karpathy's and torch's convention)."""
        return FLOPS_PER_MAC * self.macs

    @property
    def causal_effective_flops(self) -> int:
        """``flops`` without the work a causal mask discards (the unmasked work only)."""
        return self.flops - self.masked_flops

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{name: getattr(self, name) + getattr(other, name)
                         for name in Counts.model_fields})


class TensorSpec(Record):
    """Shape and dtype of one tensor."""

    shape: list[int | str]
    """Sizes; a dynamic size is its expression as a string."""
    dtype: str
    """torch dtype name, e.g. ``float32``."""


NodeStatus = Literal["counted", "zero", "uncounted", "error"]


class NodeRecord(Record):
    """One call_function node of the exported graph and its cost."""

    name: str
    """The node's name in the graph."""
    op: str
    """The op, e.g. ``aten.linear.default``."""
    module: str
    """Path of the innermost module the node ran in (``""`` for the root)."""
    status: NodeStatus
    """``counted`` by a formula, ``zero`` (declared free of arithmetic), ``uncounted`` (no
    formula) or ``error`` (its formula raised)."""
    inputs: list[TensorSpec]
    """Tensor arguments, in schema order."""
    outputs: list[TensorSpec]
    """Tensor outputs."""
    cost: Counts
    """Zero for uncounted and error nodes."""
    note: str = ""
    """Why a zero op is free, or the error of a formula that raised."""


class OperatorStats(Record):
    """Calls and cost of one op."""

    calls: int
    """Number of nodes calling the op."""
    cost: Counts
    """Summed cost of those nodes."""


class ModuleRecord(Record):
    """One module of the model's tree."""

    path: str
    """Path as ``named_modules()`` names it; ``""`` is the root."""
    type: str
    """Qualified class name, ``""`` when only a saved program was analyzed and it never ran."""
    depth: int
    """0 for the root, 1 for its children, ..."""
    calls: int
    """How many times the module ran in the forward (0 for a module that never ran)."""
    params: int
    """Parameters of the module and its children; a tied parameter counts once, at its first
    name in ``named_parameters()`` order."""
    own_params: int
    """Parameters registered directly on this module (tied ones at their first name only)."""
    tied_params: list[str] = []
    """This module's parameter names that are tied to a parameter counted at another name."""
    inclusive: Counts
    """Cost of the module's own ops and of its children's."""
    exclusive: Counts
    """Cost of the ops that ran in this module itself (its functionals), not in a child."""
    operators: dict[str, OperatorStats] = {}
    """Inclusive cost per op (fvcore's by_module_and_operator)."""


class UncountedOp(Record):
    """An op the analysis could not count: it has no formula, or its formula raised."""

    op: str
    """The op, e.g. ``mylib.fused_rope.default``."""
    calls: int
    """Number of nodes calling it."""
    modules: list[str]
    """Paths of the modules it ran in."""
    nodes: list[str]
    """Graph node names."""
    reason: str
    """``no formula`` or the formula's error."""


class TiedParameter(Record):
    """A parameter reachable under two names, counted once."""

    name: str
    """The name not counted, e.g. ``lm_head.weight``."""
    counted_as: str
    """The name it is counted under, e.g. ``transformer.wte.weight``."""


class Timing(Record):
    """Latency over the measured iterations, in seconds."""

    median_s: float
    """Median over the repeats."""
    min_s: float
    """Fastest repeat."""
    max_s: float
    """Slowest repeat."""


class NodeTiming(Record):
    """Measured latency of one node of the replayed graph."""

    name: str
    """The node's name, as in `NodeRecord.name`."""
    module: str
    """Path of the innermost module the node ran in."""
    latency: Timing
    """The node's latency."""


class ModuleTiming(Record):
    """Latency of one module: the sum of its nodes' median latencies."""

    path: str
    """Module path, as in `ModuleRecord.path`."""
    inclusive_s: float
    """Sum over the nodes of the module and its children."""
    exclusive_s: float
    """Sum over the nodes that ran in the module itself."""


class RuntimeProfile(Record):
    """Measured latency of a replay of the exported graph, per node and module, and MFU."""

    device: str
    """Where it ran, e.g. ``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    timer: str
    """How nodes were timed, e.g. ``time.perf_counter_ns`` or ``cuda events``."""
    warmup: int
    """Iterations run before measuring."""
    repeat: int
    """Iterations measured."""
    nodes: list[NodeTiming]
    """Every timed node, in graph order."""
    modules: list[ModuleTiming]
    """Every module with at least one timed node, parents before children."""
    hooked_total: Timing
    """One whole replay with per-node timing."""
    plain_total: Timing
    """One plain forward with no instrumentation, end to end."""
    overhead_s: float
    """``hooked_total.median_s - plain_total.median_s``: what the instrumentation costs."""
    residual_s: float
    """``plain_total.median_s`` minus the sum of node medians: time no node accounts for."""
    peak_flop_per_s: float | None
    """Dense peak FLOP/s the MFU is computed against; None when unknown."""
    peak_source: str
    """Where the peak comes from: ``user`` or the device table row and its source."""
    achieved_flop_per_s: float
    """Model FLOPs / ``plain_total.median_s``."""
    mfu: float | None
    """``achieved_flop_per_s / peak_flop_per_s``; None without a peak."""


class Report(Record):
    """The analysis of one model call: per node, per module, per op, and in total."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The analyzed model's class (or the saved program's path)."""
    inputs: list[TensorSpec]
    """The example inputs' shapes and dtypes, flattened in argument order."""
    torch_version: str
    """torch that exported the graph."""
    exportflops_version: str
    """exportflops that counted it."""
    total: Counts
    """The whole model: the sum over every node."""
    params: int
    """Parameters of the model, tied ones counted once."""
    tied_parameters: list[TiedParameter] = []
    """Parameters reachable under more than one name, and the name each is counted under."""
    modules: list[ModuleRecord]
    """The module tree, parents before children."""
    operators: dict[str, OperatorStats]
    """Cost per op over the whole model."""
    uncounted: list[UncountedOp]
    """Ops with no formula or whose formula raised; their cost is missing from every total."""
    nodes: list[NodeRecord]
    """Every call_function node, in graph order."""
    runtime: RuntimeProfile | None = None
    """Measured latencies, when `exportflops.profile` ran the graph."""

    @property
    def coverage(self) -> float:
        """Fraction of nodes counted by a formula or declared free (1.0 when nothing is missing)."""
        missing = sum(u.calls for u in self.uncounted)
        return 1.0 - missing / len(self.nodes) if self.nodes else 1.0

    def module(self, path: str) -> ModuleRecord:
        for record in self.modules:
            if record.path == path:
                return record
        raise KeyError(f"no module {path!r} in the report of {self.model}; "
                       f"module paths are named_modules() names, '' is the root")

    def by_module(self, depth: int | None = None) -> dict[str, Counts]:
        """Inclusive cost per module path, optionally only modules up to ``depth``."""
        return {m.path: m.inclusive for m in self.modules if depth is None or m.depth <= depth}

    def by_operator(self) -> dict[str, OperatorStats]:
        return dict(self.operators)

    def by_module_and_operator(self) -> dict[str, dict[str, OperatorStats]]:
        """Per module path, its inclusive cost per op."""
        return {m.path: dict(m.operators) for m in self.modules}
