"""The report of one analysis: nodes, modules, operators, and the whole model."""

from __future__ import annotations

from typing import Any, Literal

from .names import Moved
from .symbolic import Evaluator
from .base import SCHEMA_VERSION, Cost, NotebookRecord, Record, TensorSpec
from .collectives import Collective
from .timing import RuntimeProfile


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
    cost: Cost
    """Zero for uncounted and error nodes."""
    note: str = ""
    """Why a zero op is free, or the error of a formula that raised."""
    phase: Literal["forward", "backward"] = "forward"
    """``backward`` for the ops that compute gradients (``mode="train"``)."""
    differentiates: str = ""
    """For a backward op: the forward node whose gradient it computes."""
    gradient: Literal["", "input", "weight"] = ""
    """For a backward op counted with the backward split (``analyze(split_backward=True)``):
    ``input`` when it runs in the pass that computes the inputs' gradients (torch's
    zero-bubble ``I`` action, ``stage_backward_input``), ``weight`` in the pass that computes
    the parameters' (``W``, ``stage_backward_weight``); empty otherwise."""
    eager_inputs: list[TensorSpec] = []
    """The tensor arguments an eager run passes the op, in schema order, where the exported
    graph passes others (a branch the model's code takes only when traced); empty when they
    are the same. Set on transformers' sdpa attention, whose graph repeats grouped-query
    attention's key/value heads and passes a mask, where an eager call on a batch without
    padding passes query and the key/value heads as they are (``enable_gqa=True``)
    (`exportflops.graph.eager_heads`). The cost is the graph's; context parallelism's ring
    sends these key/value."""

    def evaluated(self, sizes: Evaluator) -> NodeRecord:
        return self.model_copy(update={
            "cost": self.cost.evaluated(sizes),
            "inputs": [t.evaluated(sizes) for t in self.inputs],
            "outputs": [t.evaluated(sizes) for t in self.outputs],
            "eager_inputs": [t.evaluated(sizes) for t in self.eager_inputs],
        })


class OperatorStats(Record):
    """Calls and cost of one op."""

    calls: int
    """Number of nodes calling the op, forward and backward."""
    cost: Cost
    """Summed cost of those nodes."""
    backward_calls: int = 0
    """How many of the calls compute gradients."""
    backward: Cost = Cost()
    """The part of ``cost`` spent computing gradients."""

    def evaluated(self, sizes: Evaluator) -> OperatorStats:
        return self.model_copy(update={"cost": self.cost.evaluated(sizes),
                                       "backward": self.backward.evaluated(sizes)})


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
    inclusive: Cost
    """Cost of the module's own ops and of its children's (forward and, in train mode,
    backward)."""
    backward: Cost = Cost()
    """The part of ``inclusive`` spent computing gradients (``mode="train"``)."""
    exclusive: Cost
    """Cost of the ops that ran in this module itself (its functionals), not in a child."""
    operators: dict[str, OperatorStats] = {}
    """Inclusive cost per op (fvcore's by_module_and_operator)."""
    exclusive_operators: dict[str, OperatorStats] = {}
    """Cost per op of the nodes that ran in this module itself, not in a child (its
    functionals); they sum to ``exclusive``."""

    def evaluated(self, sizes: Evaluator) -> ModuleRecord:
        return self.model_copy(update={
            "inclusive": self.inclusive.evaluated(sizes),
            "exclusive": self.exclusive.evaluated(sizes),
            "backward": self.backward.evaluated(sizes),
            "operators": {op: s.evaluated(sizes) for op, s in self.operators.items()},
            "exclusive_operators": {op: s.evaluated(sizes)
                                    for op, s in self.exclusive_operators.items()},
        })


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


class SizeSymbolRecord(Record):
    """A dynamic size of the exported graph: counts are expressions in these names."""

    name: str
    """The ``torch.export.Dim`` name (torch's own ``s0`` when the user gave none)."""
    example: int | None
    """Its value in the example inputs; None for a data-dependent size."""
    data_dependent: bool = False
    """A size that depends on the inputs' values (the count of a ``nonzero``, a routing), not
    on their shapes: no example value; `Report.evaluate` needs it given."""
    min: int | None
    """Smallest value export allows, when bounded."""
    max: int | None
    """Largest value export allows, when bounded."""


class Report(NotebookRecord):
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
    total: Cost
    """The whole model: the sum over every node (forward and, in train mode, backward)."""
    backward: Cost = Cost()
    """The part of ``total`` spent computing gradients."""
    backward_weight: Cost | None = None
    """With the backward split (``analyze(split_backward=True)``): the part of ``backward``
    in the parameters' pass (nodes with ``gradient="weight"``); the rest, `backward_input`,
    is the inputs' pass. None when the backward was counted whole."""
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
    world_size: int = 1
    """Ranks of the default process group of a parallelized model (1 otherwise); every count
    above is this one rank's, from its local shards."""
    rank: int = 0
    """The rank analyzed."""
    collectives: list[Collective] = []
    """Every collective this rank issues, in graph order (a parallelized model)."""
    value_guards: list[str] = []
    """Conditions on the example inputs' values that export could not decide from their shapes
    (``Ne(u4, 0)``: a split by an image grid's values; ``Eq(u0, 1)``: a tensor's truth read as
    1), decided by running the model on those values (`torch.export.draft_export`), each as the
    condition that held: the counts are those of inputs that meet them. Where export passed
    with a size read from the values that no branch asks about (``nonzero``), that size at its
    value in a run on the example (``Eq(u0, 3)``). Empty when every branch and size depends on
    shapes alone."""
    capture: Literal["export", "eager"] = "export"
    """Where the counted ops come from: ``export``, the graph torch.export captured;
    ``eager``, one eager run of a model torch.export refused (a tensor its ``forward`` stores
    on itself, LeViT's attention biases), every ATen op recorded with its module as it was
    dispatched (`exportflops.capture.eager`). An eager count has no symbolic sizes (the
    example's), its branches are those the run took, and its ops are the ones eager
    dispatches below autograd (``aten.addmm`` where export keeps ``aten.linear``), counted by
    the same formulas. `capture_notes` says why."""
    capture_notes: list[str] = []
    """How the counted call differs from the call as given, one line each: torch.export's
    refusal behind an eager count; ``use_cache=False`` passed to a transformers model called
    without it (its KV cache serves generation, and export cannot return it)."""

    @property
    def forward(self) -> Cost:
        """The forward pass alone."""
        return self.total - self.backward

    @property
    def backward_input(self) -> Cost | None:
        """With the backward split: the part of ``backward`` in the inputs' pass."""
        return None if self.backward_weight is None else self.backward - self.backward_weight

    @property
    def backward_ratio(self) -> float | None:
        """Backward FLOPs / forward FLOPs (None before a forward FLOP is counted)."""
        forward = self.forward.flops
        return None if forward == 0 else self.backward.flops / forward

    def evaluate(self, **sizes: int) -> Report:
        """This report with every dynamic size set: ``report.evaluate(seq=2048)``.

        Sizes not given keep their example value (a data-dependent size has none: it must be
        given). No re-export: the expressions are evaluated.
        """
        evaluator = Evaluator(_size_values(self, sizes))

        def each(records: list) -> list:
            return [r.evaluated(evaluator) for r in records]

        return self.model_copy(update={
            "inputs": each(self.inputs),
            "total": self.total.evaluated(evaluator),
            "backward": self.backward.evaluated(evaluator),
            "backward_weight": (None if self.backward_weight is None
                                else self.backward_weight.evaluated(evaluator)),
            "symbols": [],
            "modules": each(self.modules),
            "operators": {op: s.evaluated(evaluator) for op, s in self.operators.items()},
            "nodes": each(self.nodes),
        })

    def sweep(self, **sizes: list[int]) -> list[Report]:
        """One evaluated report per value: ``report.sweep(seq=[512, 1024, 2048])``.

        Several names sweep together, element by element (their lists must be equally long).
        """
        lengths = {len(values) for values in sizes.values()}
        if len(lengths) > 1:
            raise ValueError(f"sweep() lists must be equally long, got lengths "
                             f"{ {k: len(v) for k, v in sizes.items()} }")
        return [self.evaluate(**dict(zip(sizes, point))) for point in zip(*sizes.values())]

    def with_paths(self, paths: dict[str, str]) -> Report:
        """This report with each module path ``p`` of ``paths`` written ``paths[p]`` wherever
        it names a module: the module tree, the nodes (and the names of those copied into a
        repeated block), the uncounted ops, the collectives, the tied parameters (a
        parameter's module part) and the measured nodes and modules. The report of a call
        alike another's (a pipeline stage of the same layers as an earlier one) under its own
        names."""
        moved = Moved(paths)
        return self.model_copy(update={
            "modules": [m.model_copy(update={"path": moved.path(m.path)})
                        for m in self.modules],
            "nodes": [moved.node_record(n) for n in self.nodes],
            "uncounted": [u.model_copy(update={"modules": [moved.path(p) for p in u.modules],
                                               "nodes": [moved.node(n) for n in u.nodes]})
                          for u in self.uncounted],
            "collectives": [moved.collective(c) for c in self.collectives],
            "tied_parameters": [t.model_copy(update={
                "name": moved.parameter(t.name), "counted_as": moved.parameter(t.counted_as)})
                for t in self.tied_parameters],
            "runtime": self.runtime and self.runtime.model_copy(update={
                "nodes": [n.model_copy(update={"name": moved.node(n.name),
                                               "module": moved.path(n.module)})
                          for n in self.runtime.nodes],
                "modules": [m.model_copy(update={"path": moved.path(m.path)})
                            for m in self.runtime.modules]}),
        })

    @property
    def coverage(self) -> float:
        """Share of the nodes that do arithmetic which are counted: counted nodes over counted,
        uncounted and failed ones. Nodes declared free (views, getitem) are in neither part, so
        they cannot flatter it; 1.0 when no node needs a formula."""
        counted = sum(1 for n in self.nodes if n.status == "counted")
        missing = sum(u.calls for u in self.uncounted)
        return counted / (counted + missing) if counted + missing else 1.0

    def module(self, path: str) -> ModuleRecord:
        for record in self.modules:
            if record.path == path:
                return record
        raise KeyError(f"no module {path!r} in the report of {self.model}; "
                       f"module paths are named_modules() names, '' is the root")

    def by_module(self, depth: int | None = None) -> dict[str, Cost]:
        """Inclusive cost per module path, optionally only modules up to ``depth``."""
        return {m.path: m.inclusive for m in self.modules if depth is None or m.depth <= depth}

    def by_operator(self, module: str = "") -> dict[str, OperatorStats]:
        """Cost per op of ``module`` and its children (the whole model by default)."""
        return dict(self.module(module).operators)

    def by_module_and_operator(self) -> dict[str, dict[str, OperatorStats]]:
        """Per module path, its inclusive cost per op."""
        return {m.path: dict(m.operators) for m in self.modules}

    def unsupported_ops(self, module: str = "") -> dict[str, int]:
        """Calls per uncounted op in ``module`` and its children (fvcore's name): the ops whose
        cost is missing from every total."""
        inside = _inside(self.module(module).path)
        calls: dict[str, int] = {}
        for node in self.nodes:
            if node.status in ("uncounted", "error") and inside(node.module):
                calls[node.op] = calls.get(node.op, 0) + 1
        return calls

    def uncalled_modules(self) -> set[str]:
        """Paths of the modules that never ran in the analyzed call (fvcore's name). A module
        whose own forward never ran while a module under it did is a container (an
        ``nn.ModuleList``, an ``nn.ModuleDict``): it is left out, as fvcore's
        ``skip_uncalled_containers`` has it."""
        called = [m.path for m in self.modules if m.calls]
        return {m.path for m in self.modules if m.calls == 0
                and not any(_inside(m.path)(path) for path in called if path != m.path)}

    def to_pandas(self, rows: Literal["modules", "operators", "nodes"] = "modules") -> Any:
        """One row per module, op or node as a pandas DataFrame, the columns of `to_csv` (needs
        ``pip install 'exportflops[pandas]'``; docs/reports.md lists the columns): counts in
        base units, module path and depth as columns, ``backward_*`` in train mode."""
        from ..render.tables import to_pandas

        return to_pandas(self, rows)

    def _repr_html_(self) -> str:
        """What Jupyter shows: the summary and a collapsible module tree, as the text views
        write the numbers (plain HTML, no script)."""
        from ..render.notebook import report_html

        return report_html(self)


def _inside(path: str):
    """Whether a module path is ``path`` or under it."""
    return lambda other: not path or other == path or other.startswith(path + ".")


def _size_values(report: Report, sizes: dict[str, int]) -> dict[str, int]:
    """Every dynamic size of ``report``: the given value, else its example; checked."""
    known = {s.name: s for s in report.symbols}
    unknown = sorted(set(sizes) - set(known))
    if unknown:
        raise KeyError(f"{report.model} has no dynamic size {', '.join(unknown)}; its dynamic "
                       f"sizes are: {', '.join(known) or 'none (the report is concrete)'}")
    values = {}
    for name, symbol in known.items():
        value = sizes.get(name, symbol.example)
        if value is None:
            raise ValueError(f"size {name!r} of {report.model} is data-dependent and has no "
                             f"example value: pass {name}=<int>")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"size {name!r} must be an int, got {type(value).__name__}")
        if (symbol.min is not None and value < _lowest(symbol.min)) or (
                symbol.max is not None and value > symbol.max):
            raise ValueError(f"size {name}={value} is outside the range the graph was exported "
                             f"for: [{symbol.min}, {symbol.max}]")
        values[name] = value
    return values


def _lowest(exported_min: int) -> int:
    # export gives every dynamic size a minimum of 2 (it specializes sizes 0 and 1), not because
    # the graph's ops change at 1: counting at 1 evaluates the same ops.
    return 1 if exported_min == 2 else exported_min
