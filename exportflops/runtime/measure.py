"""Measured latency: replay the exported graph with a timer around every node.

`profile` exports the model once, counts that graph with `analyze`, and replays the same graph
(``program.module()``, the unlifted graph module whose node names are the report's) with a clock
around every node the report counts (`exportflops.runtime.timing`), beside the plain forward (the
user's model itself when profile() was given one; ``program.module()`` for a program or a report).
After ``warmup`` iterations, ``repeat`` are measured; `measured.runtime_profile` turns those
samples into the report's `RuntimeProfile`: a node's latency is its median over them (with min and
max). The residual (plain end to end minus the sum of node medians) is what no node accounts for:
Python between nodes, module calls, input flattening; the overhead (timed replay minus plain) is
what the instrumentation costs. Neither is clamped: noise can make a small one negative.

The runs happen under the caller's grad mode (wrap the call in ``torch.no_grad()`` to time
inference) and leave the model as they found it: they write to copies of its buffers
(batch-norm statistics), swapped in and back, and the RNG is forked so that dropout in the runs
draws nothing from the caller's stream. Python attributes a forward changes are not covered.

Where the call runs and whether its inputs fit the program is checked first
(`exportflops.capture.placement`); the peak the MFU is measured against is
`exportflops.roofline.devices`'s.
The training-loop form is `exportflops.runtime.profiler.FlopsProfiler`.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..roofline import devices
from . import measured, timing
from ..aggregate import build_report
from ..api import analyze, count_call, count_captured
from ..capture.export import capture, without_cache
from ..errors import InputError, ProfileError
from ..progress import Progress, showing, stage
from ..capture.placement import (
    check_counted_inputs, check_inputs, check_runnable, device_label, flat_inputs, wanted_device,
)
from ..records import Report
from ..capture.saved import load
from ..torch_internals import pytree
from ..graph.walk import op_name


class _NotGiven:
    """The default of a deprecated argument, told apart from every value a caller can pass."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()


def profile(target: Any, args: Any = None, kwargs: dict | None = None, *,
            device: str | torch.device | None = None, warmup: int = 10, repeat: int = 50,
            peak_flop_per_s: float | bool | None = None,
            program: torch.export.ExportedProgram | str | os.PathLike | None = None,
            peak_flops: float | bool | None = NOT_GIVEN,
            progress: bool | Progress = False) -> Report:
    """Count one call and measure it: the `analyze` report with ``runtime`` filled in.

    ``target`` is an ``nn.Module`` (exported once, here), an ``ExportedProgram`` (or the path of
    a saved one), or a `Report`. A report is JSON data and carries no graph: pass the program it
    was analyzed from as ``program=`` (a report analyzed from a saved ``.pt2`` finds it by its
    ``model`` path); its counts are reused, nothing is re-exported, and its node names must be
    the program's.

    ``args``/``kwargs`` are the call's inputs; for a program or a report they default to the
    program's example inputs, and must have the shapes the program was exported for.
    ``device`` states where to run: the parameters and the inputs must already be there
    (nothing is moved; the graph may hold device constants). ``peak_flop_per_s`` is the dense
    peak in FLOP/s for the MFU; by default it comes from `exportflops.roofline.devices` (a GPU's
    datasheet row, or an estimate for the CPU, labelled so), and ``False`` skips the MFU.
    ``peak_flops`` is its deprecated name. ``progress=True`` shows the stage and the elapsed
    seconds on stderr.
    """
    with showing(progress):
        return _profile(target, args, kwargs, device, warmup, repeat, peak_flop_per_s, program,
                        peak_flops)


def _profile(target, args, kwargs, device, warmup, repeat, peak_flop_per_s, program,
             peak_flops) -> Report:
    peak_argument = check_peak_argument(peak_flop_per_s, peak_flops, "profile()")
    check_iterations(warmup, repeat, "profile()")
    wanted = wanted_device(device)
    call = _resolve(target, args, kwargs, program, wanted)
    _check_concrete(call.report)
    graph_module = call.program.module()
    name = call.report.model
    run_on = check_runnable(graph_module, name, call.args, call.kwargs, wanted)
    peak = devices.mfu_peak(peak_argument, run_on, call.report)
    check_inputs(call.program, name, call.args, call.kwargs)
    check_counted_inputs(call.report, call.args, call.kwargs)
    plain = call.model if call.model is not None else graph_module
    timed = _timed_nodes(graph_module, call.report)
    inputs = _fresh_inputs(graph_module, call.program, call.args, call.kwargs)
    with _on_copies_of_state(graph_module, plain, run_on):
        samples = timing.measure(graph_module, timed, inputs, plain, run_on, warmup, repeat)
    reference = ("the model's own forward" if call.model is not None
                 else "program.module(), no eager model given")
    timer = (f"{samples.clock}; plain forward: {reference}; autograd "
             f"{'on' if torch.is_grad_enabled() else 'off'}")
    runtime = measured.runtime_profile(call.report, samples, peak, device=device_label(run_on),
                              timer=timer, warmup=warmup)
    # A new record, the count measured: the report it times may be the caller's, left as given.
    return call.report.model_copy(update={"runtime": runtime})


# --- the arguments -----------------------------------------------------------------------------

def check_peak_argument(peak_flop_per_s: Any, peak_flops: Any, caller: str) -> float | bool | None:
    """The dense peak in FLOP/s asked for (None: look it up; False: no MFU), also when given by
    its deprecated name ``peak_flops=``."""
    if peak_flops is not NOT_GIVEN:
        if peak_flop_per_s is not None:
            raise TypeError(f"{caller} got both peak_flop_per_s= and peak_flops= (its deprecated "
                            f"name): pass only peak_flop_per_s=")
        # stacklevel 3: the warning points at the user's call of `caller`, not at this helper.
        warnings.warn(f"{caller}: peak_flops= is deprecated, pass peak_flop_per_s= (the same "
                      f"dense peak in FLOP/s)", DeprecationWarning, stacklevel=3)
        peak_flop_per_s = peak_flops
    if peak_flop_per_s is None or peak_flop_per_s is False:
        return peak_flop_per_s
    if (isinstance(peak_flop_per_s, bool) or not isinstance(peak_flop_per_s, numbers.Real)
            or not peak_flop_per_s > 0):
        raise ValueError(f"peak_flop_per_s is a dense peak in FLOP/s (> 0), None to look it up, "
                         f"or False for no MFU; got {peak_flop_per_s!r}")
    return peak_flop_per_s


def check_iterations(warmup: Any, repeat: Any, caller: str) -> None:
    """`InputError` unless ``warmup`` (untimed iterations) is an integer >= 0 and ``repeat``
    (timed ones) one >= 1; the message leads with ``caller``, the call that takes them."""
    integers = all(isinstance(n, int) and not isinstance(n, bool) for n in (warmup, repeat))
    if not (integers and warmup >= 0 and repeat >= 1):
        raise InputError(f"{caller} needs integers warmup >= 0 and repeat >= 1, got "
                         f"warmup={warmup!r}, repeat={repeat!r}: pass warmup= the untimed "
                         f"iterations (0 or more) and repeat= the timed ones (1 or more).")


# --- what to run -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Call:
    report: Report
    """The counts of ``program``'s graph."""
    program: torch.export.ExportedProgram
    model: torch.nn.Module | None
    """The user's model, whose own forward is the plain reference; None for a program or a
    report (then the plain reference is ``program.module()``)."""
    args: tuple
    kwargs: dict


def _resolve(target: Any, args: Any, kwargs: dict | None, program: Any,
             wanted: torch.device | None) -> _Call:
    """The report, its program and the inputs for each kind of ``target``."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"profile() takes kwargs as a dict of keyword arguments, got "
                        f"{type(kwargs).__name__}")
    if program is not None and not isinstance(target, Report):
        raise TypeError(f"profile(..., program=) names the program of a Report; the "
                        f"{type(target).__name__} given is timed itself: leave program= out")
    if isinstance(target, torch.nn.Module):
        name = type(target).__name__
        if args is None:
            raise TypeError(f"profile({name}, args) needs the example inputs of the call to time")
        # Checked before exporting: a meta model or split devices fail here, not deep in export.
        check_runnable(target, name, args, kwargs, wanted)
        stage("export")
        # A transformers model called as it comes is timed and counted as analyze counts it:
        # without the cache its output would hold (`capture.export.without_cache`).
        kwargs, _, note = without_cache(target, args, kwargs)
        captured = capture(target, args, kwargs)
        # The graph just exported counted (no second export), named after the model and at
        # the sizes its example's values decided, as analyze(model) counts it.
        report = count_captured(captured, notes=[note] if note else [])
        return _Call(report, captured.program, target, captured.args, captured.kwargs)
    if isinstance(target, Report):
        report, program = target, _program_of(target, program)
        _check_same_graph(report, program)
    elif isinstance(target, torch.export.ExportedProgram):
        program, report = target, analyze(target)
    elif isinstance(target, (str, os.PathLike)):
        # Loaded once; the report is named by the path, as analyze(path) names it.
        program = load(target)
        report = build_report(dataclasses.replace(count_call(program), model=os.fspath(target)))
    else:
        raise TypeError(f"profile() takes an nn.Module, a torch.export.ExportedProgram (or the "
                        f"path of a saved one) or a Report; got {type(target).__name__}")
    if args is None:
        if kwargs is not None:
            raise TypeError("profile() was given kwargs without args: pass both (args=() for "
                            "none), or neither to time the program's example inputs")
        args, kwargs = _example_inputs(program, report.model)
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"profile() takes args as a tuple of positional arguments (or one "
                        f"tensor), got {type(args).__name__}")
    return _Call(report, program, None, tuple(args), dict(kwargs or {}))


def _example_inputs(program: torch.export.ExportedProgram, name: str) -> tuple[tuple, dict]:
    if program.example_inputs is None:
        raise ProfileError(f"The program of {name} carries no example inputs: pass the inputs "
                           f"to time, profile(target, args, kwargs).")
    return program.example_inputs


def _program_of(report: Report, program: Any) -> torch.export.ExportedProgram:
    if isinstance(program, torch.export.ExportedProgram):
        return program
    if program is not None:
        return load(program)
    if os.path.isfile(report.model):
        return load(report.model)  # analyze() names a report of a saved program by its path
    raise ProfileError(
        f"The report of {report.model} is data and holds no graph to replay. Pass the program "
        f"it was analyzed from: profile(report, args, program=exported_program), or profile "
        f"the model itself: profile(model, args) exports once, counts and times that graph."
    )


def _check_same_graph(report: Report, program: torch.export.ExportedProgram) -> None:
    in_program = {n.name: op_name(n.target) for n in program.graph.nodes
                  if n.op == "call_function"}
    missing = [n.name for n in report.nodes if n.name not in in_program]
    differ = [n.name for n in report.nodes
              if n.name in in_program and in_program[n.name] != n.op]
    if not missing and not differ:
        return
    train = ("It counts the backward too (mode='train'); profile() times the forward graph. "
             if report.mode != "forward" else "")
    raise ProfileError(
        f"The report of {report.model} was not analyzed from this program: {len(missing)} of "
        f"its nodes are not in the program's graph ({_first_names(missing)}) and {len(differ)} "
        f"run another op ({_first_names(differ)}). {train}Pass the program the report was made "
        f"from, or profile the model itself."
    )


def _first_names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _check_concrete(report: Report) -> None:
    if not isinstance(report.total.flops, int):
        raise ProfileError(
            f"The report's counts are expressions of dynamic sizes ({report.total.flops}); a "
            f"measured call has one size. Pass the report evaluated at the inputs' sizes, "
            f"profile(report.evaluate(name=size, ...), args, program=program), or export "
            f"without dynamic_shapes."
        )


# --- the runs ----------------------------------------------------------------------------------

def _timed_nodes(graph_module: torch.fx.GraphModule, report: Report) -> list[torch.fx.Node]:
    """The graph module's nodes that the report counts, in graph order."""
    in_report = {n.name for n in report.nodes}
    # Nodes that unlifting adds (write-backs of mutated buffers, copy_) are not in the report:
    # they run untimed and land in the residual.
    timed = [n for n in graph_module.graph.nodes if n.op == "call_function" and n.name in in_report]
    missing = in_report - {n.name for n in timed}
    if missing:
        raise ProfileError(
            f"{len(missing)} nodes of the report of {report.model} are not in program.module()'s "
            f"graph ({_first_names(sorted(missing))}): this torch ({torch.__version__}) "
            f"renames nodes when unlifting, so their timings cannot be matched to the counts. "
            f"Please report it with the torch version."
        )
    return timed


def _fresh_inputs(module: torch.fx.GraphModule, program: torch.export.ExportedProgram,
                  args: tuple, kwargs: dict) -> Callable[[], timing.Inputs]:
    """The inputs for one run; cloned first (outside the timed region) when the graph writes
    to an input in place, so that every run sees the caller's values."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if not _writes_to(module.graph, set(placeholders)):
        flat = flat_inputs(program, args, kwargs)
        return lambda: (args, kwargs, flat)

    def clone(x: Any) -> Any:
        return x.clone() if isinstance(x, torch.Tensor) else x

    def fresh() -> timing.Inputs:
        a, k = pytree.tree_map(clone, (args, kwargs))
        return a, k, flat_inputs(program, a, k)
    return fresh


def _writes_to(graph: torch.fx.Graph, targets: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """Which of ``targets`` some op's schema marks as written (``Tensor(a!)``)."""
    written = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for i, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            if value in targets:
                written.add(value)
    return written


@contextmanager
def _on_copies_of_state(graph_module: torch.fx.GraphModule, plain_module: torch.nn.Module,
                        run_on: torch.device) -> Iterator[None]:
    """Run on copies of the state the runs write, swapped into the modules and back on exit:
    every buffer (batch-norm statistics update in place, and aten.batch_norm's schema does not
    say so) and the parameters an op writes; and fork the device's RNG. The originals are not
    written at all, so neither their values nor their autograd version counters change: a
    training step's pending backward may have saved them (batch norm saves its running
    statistics), and restoring them by copy would break it."""
    get_attrs = {n for n in graph_module.graph.nodes if n.op == "get_attr"}
    written = {n.target for n in _writes_to(graph_module.graph, get_attrs)}
    # The graph module holds the model's own tensors: both are swapped, and each tensor is
    # copied once (keyed by the original), so that a tensor the two share stays shared.
    copies: dict[int, torch.Tensor] = {}
    swapped = []
    for root in {id(m): m for m in (graph_module, plain_module)}.values():
        for slots, key in list(_state_slots(root, written)):
            original = slots[key]
            swapped.append((slots, key, original))
            slots[key] = copies.setdefault(id(original), _copy(original))
    cuda = [run_on.index] if run_on.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        for slots, key, original in swapped:
            slots[key] = original


def _state_slots(root: torch.nn.Module, written: set[str]) -> Iterator[tuple[dict, str]]:
    """(dict, key) of every buffer under ``root``, and of the parameters named in ``written``."""
    for path, module in root.named_modules():
        for key, tensor in module._buffers.items():
            if tensor is not None:
                yield module._buffers, key
        for key, parameter in module._parameters.items():
            if parameter is not None and f"{path}.{key}".lstrip(".") in written:
                yield module._parameters, key


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy
