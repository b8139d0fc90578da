"""analyze(): wires capture -> walk -> count -> attribution -> aggregate, and checks arguments."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch

from .aggregate import Counted, build_report
from .attribution import module_tree, program_parameters
from .capture.dtensor import rank_graph
from .capture.eager import eager_calls
from .capture.export import as_args, capture, counted_eagerly, without_cache
from .count.ranks import (check_process_group, is_parallelized, local_parameters,
                          mesh_dims, rank_fields, rank_runs)
from .errors import ExportError, InputError
from .count.backward import RECOMPUTED, trace_backward
from .count.apply import count_node, outside_torch, untraced_backward
from .count.decompose import Decomposer
from .count.recompute import DYNAMIC_GAP, checkpointed_regions, rerun_calls
from .capture.fastpath import Expansion, NotRepeated, fast_capture
from .formulas import FORMULAS, FormulaTable
from .records.names import qualified_name
from .progress import Progress, showing, stage
from .records import NodeRecord, Report, SizeSymbolRecord, TensorSpec
from .records.symbolic import parse_count
from .torch_internals import pytree
from .graph.walk import GraphRead, read_graph


def analyze(model: Any, args: Any = (), kwargs: dict | None = None, *,
            dynamic_shapes: Any = None, strict: bool = False,
            formulas: Mapping | FormulaTable | None = None,
            mode: Literal["forward", "train"] = "forward",
            progress: bool | Progress = False, fast: bool = True,
            split_backward: bool | Callable[[torch.fx.Graph], frozenset] = False) -> Report:
    """Count the FLOPs, MACs and bytes of one call ``model(*args, **kwargs)``.

    ``model`` is an ``nn.Module`` (exported here with ``torch.export.export``), an
    ``ExportedProgram``, or the path of one saved with ``torch.export.save``. ``formulas`` maps
    ops to ``(OpCall) -> Cost`` functions that extend or replace the built-in table for this
    call. ``strict=True`` raises `UncountedOpError` at the first op that cannot be counted.
    ``mode="train"`` also counts the backward: each forward op's vector-Jacobian product is
    traced through autograd on fake tensors, for the parameters and inputs that require grad.
    Sizes made dynamic with ``dynamic_shapes`` (``torch.export.Dim``) make the counts sympy
    expressions in the Dims' names; ``report.evaluate(seq=...)`` sets them.
    ``progress=True`` shows the stage and the elapsed seconds on stderr (`exportflops.progress`).
    ``fast=True`` traces each repeated block once and copies its counts to its repeats (the
    same report; see `exportflops.capture.blocks`); ``fast=False`` forces the full export.
    ``split_backward=True`` (train mode) counts the backward in the two passes torch's
    zero-bubble pipeline schedules run: each backward op says whether it computes the inputs'
    gradients or the parameters' (`NodeRecord.gradient`), and ``report.backward_weight`` sums
    the second (`exportflops.count.backward.trace_backward`). For a parallelized model's rank
    it may be a function of the rank's traced graph returning the input pass's backward nodes
    (`exportflops.graph.passes.stage_input_way`: the stages of a pipeline cut from the rank).
    """
    # Building the report allocates as much as counting does (a record per module, operator
    # and module x operator): with the collector paused for both.
    with collector_paused():
        return build_report(count_call(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                       strict=strict, formulas=formulas, mode=mode,
                                       progress=progress, fast=fast,
                                       split_backward=split_backward))


def count_call(model: Any, args: Any = (), kwargs: dict | None = None, *,
               dynamic_shapes: Any = None, strict: bool = False,
               formulas: Mapping | FormulaTable | None = None,
               mode: Literal["forward", "train"] = "forward",
               progress: bool | Progress = False, fast: bool = True,
               split_backward: bool | Callable[[torch.fx.Graph], frozenset] = False) -> Counted:
    """What `analyze` counts, before it is a report (`exportflops.aggregate.build_report`):
    for an analysis that reports parts of the call (a pipeline's stages cut from a rank)."""
    if mode not in ("forward", "train"):
        raise ValueError(f"mode must be 'forward' or 'train', got {mode!r}")
    if split_backward and mode != "train":
        raise InputError(f"split_backward=True splits the backward: it takes mode='train', "
                         f"got mode={mode!r}")
    if callable(split_backward) and not is_parallelized(model):
        raise InputError(f"split_backward as a function picks the input pass's nodes of a "
                         f"parallelized model's traced rank; {type(model).__name__} is not "
                         f"parallelized: pass split_backward=True.")
    table = _table(formulas)
    with showing(progress), _grad_mode(mode), collector_paused(), random_state_kept():
        if mode == "train":
            args, kwargs = _normal_tensors((args, kwargs))
        stage("export")
        if is_parallelized(model):
            return _parallel(model, args, kwargs, table, strict=strict, mode=mode,
                             dynamic_shapes=dynamic_shapes, split=split_backward)

        notes = []
        if isinstance(model, torch.nn.Module):
            kwargs, dynamic_shapes, note = without_cache(model, args, kwargs, dynamic_shapes)
            notes += [note] if note else []

        def full_export():
            return capture(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                           forward_only=mode != "train")

        captured, expansion = None, None
        if fast and isinstance(model, torch.nn.Module):
            captured, expansion = fast_capture(model, args, kwargs, mode == "train",
                                               dynamic_shapes)
        if captured is None:
            try:
                captured = full_export()
            except ExportError as refusal:
                if split_backward or not counted_eagerly(model, dynamic_shapes):
                    raise
                return _with_notes(_eager(model, args, kwargs, table, strict=strict,
                                          mode=mode, refusal=refusal), notes)
        reruns, note = ((_rerun_records(model, args, kwargs, table, strict=strict,
                                        dynamic=dynamic_shapes is not None))
                        if mode == "train" else ([], ""))
        notes += [note] if note else []
        try:
            counted = _count(captured, table, strict=strict, mode=mode, expansion=expansion,
                             split=split_backward, reruns=reruns)
        except NotRepeated:  # a repeat's backward is not its model's: trace it in full
            counted = _count(full_export(), table, strict=strict, mode=mode,
                             split=split_backward, reruns=reruns)
        return _with_notes(counted, notes)


def _rerun_records(model: Any, args: Any, kwargs: dict | None, table: FormulaTable, *,
                   strict: bool, dynamic: bool) -> tuple[list[NodeRecord], str]:
    """The records of the ops non-reentrant activation checkpointing reruns in a training
    step's backward (`exportflops.count.recompute`), noted as recomputed; with dynamic sizes,
    none and a note naming the regions left out."""
    if not isinstance(model, torch.nn.Module):
        return [], ""
    args, kwargs = as_args(args, model), dict(kwargs or {})
    if dynamic:
        regions = checkpointed_regions(model, args, kwargs)
        return [], DYNAMIC_GAP.format(regions=regions) if regions else ""
    with rerun_calls(model, args, kwargs) as rerun:
        if rerun is None:
            return [], ""
        graph, calls = rerun
        count = _node_counter(graph, table, strict=strict, sizes={})
        return [_noted(count(call, phase="backward",
                             differentiates=call.name.removesuffix(".recompute")), RECOMPUTED)
                for call in calls], ""


def _eager(model: torch.nn.Module, args: Any, kwargs: dict | None, table: FormulaTable, *,
           strict: bool, mode: str, refusal: ExportError) -> Counted:
    """The report of a model torch.export refused (``refusal``), counted from one eager run
    recorded at the dispatch level (`capture.eager`) by the same formula table, and marked
    ``capture="eager"``. Where the model does not run either, the refusal is what the user
    acts on: it is raised (a user error, such as inputs forward does not take, fails both)."""
    stage("eager")
    args, kwargs = as_args(args, model), dict(kwargs or {})
    try:
        calls = eager_calls(model, args, kwargs, train=mode == "train")
    except Exception:  # noqa: BLE001 - the model does not run: export's error says why
        raise refusal from refusal.__cause__
    count = functools.partial(count_node, table=table, strict=strict, sizes={},
                              decomposer=Decomposer(None, {}))
    nodes = [outside_torch(call.node, call.outside, strict=strict, phase=call.phase,
                           differentiates=call.differentiates) if call.outside
             else count(call.node, phase=call.phase, differentiates=call.differentiates)
             for call in calls]
    forward = [call.node for call in calls if call.phase == "forward"]
    tree, tied = module_tree(forward, model.named_parameters(remove_duplicate=False), model,
                             qualified_name(type(model)))
    # torch's first sentence names the refusal; the rest is its advice for export.
    refused = refusal.torch_message.strip().split(". ")[0][:200]
    return Counted(nodes, tree, tied, model=type(model).__name__,
                   inputs=_input_specs(args, kwargs), mode=mode, capture="eager",
                   capture_notes=[
        f"torch.export refused {type(model).__name__} ({refused}); counted from one eager "
        f"run at the dispatch level: sizes are the example's (no symbolic sizes), branches "
        f"those the run took, ops the ATen ops eager dispatches"])


def _with_notes(counted: Counted, notes: list[str]) -> Counted:
    """``counted`` with the notes on how its call differs from the call as given first."""
    if not notes:
        return counted
    return dataclasses.replace(counted, capture_notes=[*notes, *counted.capture_notes])


def _parallel(model, args, kwargs, table: FormulaTable, *, strict: bool, mode: str,
              dynamic_shapes: Any, split: bool | Callable = False) -> Counted:
    """A model parallelized with torch.distributed: this rank's report, counted by the same
    tail as any graph (`_node_counter`), with its collectives (`exportflops.parallel`);
    ``split``: its backward in the input and weight passes (`exportflops.graph.passes`),
    collectives too."""
    if dynamic_shapes is not None:
        raise InputError(f"dynamic_shapes is not supported for a parallelized model "
                         f"({type(model).__name__} holds DTensor parameters): analyze it at "
                         f"fixed sizes, one call per size.")
    check_process_group(model)
    args, kwargs = as_args(args, model), dict(kwargs or {})
    # Read before the capture runs the model: FSDP2 leaves the root's parameters unsharded
    # after a forward (the root does not reshard, its backward gathers them next).
    parameters, dims = local_parameters(model), mesh_dims(model)
    with rank_graph(model, args, kwargs, train=mode == "train") as graph:
        read = read_graph(graph)
        runs = rank_runs(graph, read.nodes, train=mode == "train", split=split)
        count = _node_counter(read, table, strict=strict, sizes={})
        nodes = [_noted(count(run.call, phase=run.phase, differentiates=run.differentiates),
                        RECOMPUTED if run.rerun else "")
                 .model_copy(update={"gradient": run.gradient}) for run in runs]
        tree, tied = module_tree([run.call for run in runs], parameters, model,
                                 qualified_name(type(model)))
        fields = rank_fields(runs, dims)
    return Counted(nodes, tree, tied, model=type(model).__name__,
                   inputs=_input_specs(args, kwargs), mode=mode, **fields)


def count_captured(captured, *, strict: bool = False,
                   formulas: Mapping | FormulaTable | None = None, name: str | None = None,
                   notes: list[str] = ()) -> Report:
    """The forward `Report` of a program `capture` returned: for callers that adjust the
    captured program first (`generation` names its cache-length size). ``name``: the model
    the report names, where the program captured is a wrapper of it (default the program's);
    ``notes``: how the call captured differs from the call as given (`Report.capture_notes`)."""
    with collector_paused():
        counted = _count(captured, _table(formulas), strict=strict, mode="forward")
        return build_report(dataclasses.replace(counted, model=name or counted.model,
                                                capture_notes=[*counted.capture_notes, *notes]))


def _grad_mode(mode: str) -> contextlib.AbstractContextManager:
    """Train mode counts the step the user trains with, whatever grad mode the call is made in:
    export and replay with autograd on. Under ``torch.no_grad()`` or ``inference_mode()`` the
    export would not see the model's own ``no_grad`` regions (grad is already off, so they
    leave no wrapper) and every replayed op would record no backward."""
    if mode != "train":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


def _normal_tensors(tree: Any) -> Any:
    """Inputs made under ``inference_mode`` cannot enter autograd, which train mode's export
    needs; only their shapes and dtypes matter, so a normal copy of each stands in."""
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone() if t.is_inference() else t, tree)


def _counted(calls: list, count: Callable[..., NodeRecord],
             expansion: Expansion | None) -> list[NodeRecord]:
    """Each call's record; a repeat's copy of a node takes its model's record, moved (equal
    inputs, equal graphs: equal counts), so each distinct node is counted once."""
    records: dict[str, NodeRecord] = {}
    for call in calls:
        original = expansion.copies.get(call.name) if expansion is not None else None
        if original is not None and original[0].name in records:
            records[call.name] = records[original[0].name].model_copy(
                update={"name": call.name, "module": call.module})
        else:
            records[call.name] = count(call)
    return list(records.values())


def _count(captured, table: FormulaTable, *, strict: bool, mode: str,
           expansion: Expansion | None = None, split: bool = False,
           reruns: list[NodeRecord] = ()) -> Counted:
    """The count of ``captured``; ``reruns``: recomputed ops its graph does not hold."""
    stage("count")
    graph = read_graph(captured.program.graph, captured.program.graph_signature)
    # A formula or backward kernel that needs concrete sizes gets the example's values where
    # every size has one, as the report is then counted at them: beside counts left in
    # symbols, a count fixed at the example's would disagree at any other value.
    given = captured.given_sizes or {}
    measured = {graph.renames.get(symbol, symbol): value for symbol, value in given.items()}
    complete = all(s.symbol in measured for s in graph.symbols)
    count = _node_counter(graph, table, strict=strict, sizes=measured if complete else {})
    calls = graph.nodes if expansion is None else expansion.forward(graph.nodes)
    nodes = _counted(calls, count, expansion)
    if mode == "train":
        received: dict = {}
        backward = _backward_records(captured.program, graph, count, strict, received,
                                     given if complete else {}, split)
        nodes += backward if expansion is None else expansion.backward(calls, backward, received)
        nodes += reruns
    parameters = (program_parameters(captured.program) if expansion is None
                  else captured.module.named_parameters(remove_duplicate=False))
    tree, tied = module_tree(calls, parameters, captured.module, _type_name(captured))
    symbols = [SizeSymbolRecord(name=s.symbol.name, example=s.example, min=s.min, max=s.max,
                                data_dependent=s.example is None)
               for s in graph.symbols]
    return Counted(nodes, tree, tied, model=captured.name,
                   inputs=_input_specs(captured.args, captured.kwargs), mode=mode,
                   symbols=symbols, split=split, value_guards=list(captured.value_guards),
                   sizes=_evaluated_at(nodes, symbols, measured) if captured.given_sizes
                   else None)


def _evaluated_at(nodes: list[NodeRecord], symbols: list[SizeSymbolRecord],
                  measured: dict) -> dict[str, int] | None:
    """The sizes to count a saved program at, analyzed for the inputs the user gave, or a
    program whose branches or sizes the example's values decided (all of them known, else
    None: left symbolic)."""
    named = {s.name for s in symbols}
    sizes = {symbol.name: value for symbol, value in measured.items() if symbol.name in named}
    if _in_counts(nodes) - sizes.keys():
        return None  # a size no run gave (in a cond branch not taken): the counts keep it
    # The rest are in no count (a float a branch read): any value in their range.
    unknown = [s for s in symbols if s.example is None and s.name not in sizes]
    return {**sizes, **{s.name: s.min or 0 for s in unknown}}


def _node_counter(graph: GraphRead, table: FormulaTable, *, strict: bool,
                  sizes: dict) -> Callable[..., NodeRecord]:
    """What counts one node of ``graph``, the same for every capture: its formula, else torch's
    decomposition of its op (replayed in the graph's shape environment), else uncounted."""
    return functools.partial(count_node, table=table, strict=strict, sizes=sizes,
                             decomposer=Decomposer(graph.shape_env, graph.renames))


def _in_counts(nodes: list[NodeRecord]) -> set[str]:
    """The sizes that some node's cost or shapes are expressions of."""
    return {symbol.name for node in nodes
            for value in (*node.cost.model_dump().values(),
                          *(d for t in (*node.inputs, *node.outputs) for d in t.shape))
            if not isinstance(value, int) for symbol in parse_count(value).free_symbols}


def random_state_kept() -> contextlib.AbstractContextManager:
    """The random number generators' states as they were after the block, failed or not:
    torch.export runs the forward, and a failing export (train mode) leaves the generators
    advanced. The CUDA generators are kept where CUDA is already initialized (this never
    initializes it)."""
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=list(cuda))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while an analysis runs, then its young generation
    collected. Export and counting allocate some 10^5-10^6 objects (fake tensors, fx nodes,
    sympy, records) and the collections they trigger traverse the whole heap of a process
    holding torch: one full collection is 0.2 s, a fifth of a Llama-70B fast analysis
    (benchmarks/oneshot.py, benchmarks/overhead.py). With the collector off nothing is
    promoted, so the cycles the analysis leaves (fx graphs) are all in the young generation at
    the end and are collected there, in the analysis's own time. Nested calls, and a caller
    that turned the collector off, leave it as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _backward_records(program, graph, count: Callable[..., NodeRecord], strict: bool,
                      received: dict, measured: dict, split: bool) -> list[NodeRecord]:
    stage("backward")
    records = []
    for traced in trace_backward(program, graph, received, measured, split):
        ops = [_noted(count(call, phase="backward", differentiates=traced.forward.name),
                      traced.note) for call in traced.calls]
        if traced.failure:
            ops.insert(0, untraced_backward(traced.forward, traced.failure, strict=strict,
                                            half=traced.gradient))
        records += [r.model_copy(update={"gradient": traced.gradient}) if traced.gradient
                    else r for r in ops]
    return records


def _noted(record: NodeRecord, note: str) -> NodeRecord:
    """A backward op's record with why it runs there (a checkpoint's recomputation) first."""
    if not note:
        return record
    return record.model_copy(update={"note": f"{note}; {record.note}" if record.note else note})


def _table(formulas: Mapping | FormulaTable | None) -> FormulaTable:
    if isinstance(formulas, FormulaTable):
        return formulas
    if formulas is None or isinstance(formulas, Mapping):
        return FORMULAS.with_overrides(formulas)
    raise TypeError(f"formulas must be a dict {{op: (OpCall) -> Cost}} or a FormulaTable, "
                    f"got {type(formulas).__name__}")


def _type_name(captured) -> str:
    return "" if captured.module is None else qualified_name(type(captured.module))


def _input_specs(args: tuple, kwargs: dict) -> list[TensorSpec]:
    leaves = pytree.tree_leaves((args, kwargs))
    return [TensorSpec.of(leaf.shape, leaf.dtype)
            for leaf in leaves if isinstance(leaf, torch.Tensor)]
