"""Every public record: strict pydantic models with a documented field each. Imports no torch.

A `Report` is plain data: it serializes to JSON and back (`Report.model_validate_json`), so a
saved report renders and queries without the model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import sympy
from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

SCHEMA_VERSION = 1

#: Keep in step with ``formulas.registry.FLOPS_PER_MAC`` (records must not import torch).
FLOPS_PER_MAC = 2


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def size_symbol(name: str) -> sympy.Symbol:
    """The one symbol a dynamic size named ``name`` becomes: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


def parse_count(value: Any) -> int | sympy.Expr:
    """An int, or a sympy expression in the user's size names (from JSON: its string)."""
    if isinstance(value, bool):
        raise TypeError("a count is an integer or an expression, not a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        value = sympy.sympify(value)
        value = value.xreplace({s: size_symbol(s.name) for s in value.free_symbols})
    if isinstance(value, sympy.Basic):
        return int(value) if value.is_Integer else value
    raise TypeError(f"a count is an integer or an expression, got {type(value).__name__}")


def _dump_count(value: int | sympy.Expr) -> int | str:
    return value if isinstance(value, int) else str(value)


Count = Annotated[Any, PlainValidator(parse_count), PlainSerializer(_dump_count)]
"""An integer, or for dynamic sizes a sympy expression serialized as its string."""


class Counts(Record):
    """Work of one node, module or model: FLOPs, MACs and bytes from tensor sizes x itemsize."""

    flops: Count = 0
    """All floating-point operations: 2 per multiply-accumulate, 1 per pointwise output element
    unless the op's formula documents otherwise."""
    macs: Count = 0
    """Multiply-accumulates of contractions (matmul, linear, einsum, conv, attention)."""
    bytes_read: Count = 0
    """Bytes of the tensors the ops read, each input counted once per op."""
    bytes_written: Count = 0
    """Bytes of the tensors the ops write."""
    masked_flops: Count = 0
    """The part of ``flops`` spent on (query, key) pairs a causal mask discards."""
    masked_macs: Count = 0
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

    def __sub__(self, other: Counts) -> Counts:
        return Counts(**{name: getattr(self, name) - getattr(other, name)
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
    phase: Literal["forward", "backward"] = "forward"
    """``backward`` for the ops that compute gradients (``mode="train"``)."""
    differentiates: str = ""
    """For a backward op: the forward node whose gradient it computes."""


class OperatorStats(Record):
    """Calls and cost of one op."""

    calls: int
    """Number of nodes calling the op, forward and backward."""
    cost: Counts
    """Summed cost of those nodes."""
    backward_calls: int = 0
    """How many of the calls compute gradients."""
    backward: Counts = Counts()
    """The part of ``cost`` spent computing gradients."""


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
    """Cost of the module's own ops and of its children's (forward and, in train mode,
    backward)."""
    backward: Counts = Counts()
    """The part of ``inclusive`` spent computing gradients (``mode="train"``)."""
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
    achieved_flop_per_s: float | None = None
    """The node's FLOPs / its median latency (None for a latency of 0)."""
    mfu: float | None = None
    """``achieved_flop_per_s`` over the peak; None without a peak."""


class ModuleTiming(Record):
    """Latency of one module: the sum of its nodes' median latencies."""

    path: str
    """Module path, as in `ModuleRecord.path`."""
    inclusive_s: float
    """Sum over the nodes of the module and its children."""
    exclusive_s: float
    """Sum over the nodes that ran in the module itself."""
    achieved_flop_per_s: float | None = None
    """The module's inclusive FLOPs / ``inclusive_s`` (None for a latency of 0)."""
    mfu: float | None = None
    """``achieved_flop_per_s`` over the peak; None without a peak."""


class RuntimeProfile(Record):
    """Measured latency of a replay of the exported graph, per node and module, and MFU."""

    device: str
    """Where it ran, e.g. ``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    timer: str
    """How nodes were timed and what the plain forward ran."""
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


class SizeSymbolRecord(Record):
    """A dynamic size of the exported graph: counts are expressions in these names."""

    name: str
    """The ``torch.export.Dim`` name (torch's own ``s0`` when the user gave none)."""
    example: int | None
    """Its value in the example inputs; None for a data-dependent size."""
    min: int | None
    """Smallest value export allows, when bounded."""
    max: int | None
    """Largest value export allows, when bounded."""


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
    mode: Literal["forward", "train"] = "forward"
    """``train`` when the backward ops were counted too."""
    total: Counts
    """The whole model: the sum over every node (forward and, in train mode, backward)."""
    backward: Counts = Counts()
    """The part of ``total`` spent computing gradients."""
    symbols: list[SizeSymbolRecord] = []
    """Dynamic sizes; counts that depend on them are expressions in their names."""
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
    def forward(self) -> Counts:
        """The forward pass alone."""
        return self.total - self.backward

    @property
    def backward_ratio(self) -> float | None:
        """Backward FLOPs / forward FLOPs (None before a forward FLOP is counted)."""
        forward = self.forward.flops
        return None if forward == 0 else self.backward.flops / forward

    def evaluate(self, **sizes: int) -> Report:
        """This report with every dynamic size set: ``report.evaluate(seq=2048)``.

        Sizes not given keep their example value. No re-export: the expressions are evaluated.
        """
        from .symbolic import evaluate_report

        return evaluate_report(self, sizes)

    def sweep(self, **sizes: list[int]) -> list[Report]:
        """One evaluated report per value: ``report.sweep(seq=[512, 1024, 2048])``.

        Several names sweep together, element by element (their lists must be equally long).
        """
        lengths = {len(values) for values in sizes.values()}
        if len(lengths) > 1:
            raise ValueError(f"sweep() lists must be equally long, got lengths "
                             f"{ {k: len(v) for k, v in sizes.items()} }")
        return [self.evaluate(**dict(zip(sizes, point))) for point in zip(*sizes.values())]

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
