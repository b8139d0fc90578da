"""Measured latency: replay the exported graph with a timer around every node.

`profile` exports the model once, counts that graph with `analyze`, and replays the same graph
(``program.module()``, the unlifted graph module whose node names are the report's) in an
``fx.Interpreter`` that times every node the report counts:

- CPU: ``time.perf_counter_ns`` (a monotonic clock) just around the op call; argument lookup
  is outside;
- CUDA: a pair of CUDA events around each node and one ``torch.cuda.synchronize()`` per
  iteration, after which the events are read: the host never waits on the GPU between nodes.

Each iteration runs the plain forward end to end (the user's model itself when profile() was
given one; ``program.module()`` for a program or a report: no timing hooks, no interpreter) and
the timed replay, in alternating order so that a slow drift of the machine hits both alike.
After ``warmup`` iterations, ``repeat`` are measured; a node's latency is its median over them
(with min and max). The residual (plain end to end minus the sum of node medians) is what no
node accounts for: Python between nodes, module calls, input flattening; the overhead (timed
replay minus plain) is what the instrumentation costs. Neither is clamped: noise can make a
small one negative.

The runs happen under the caller's grad mode (wrap the call in ``torch.no_grad()`` to time
inference) and leave the model as they found it: they write to copies of its buffers
(batch-norm statistics), swapped in and back, and the RNG is forked so that dropout in the runs
draws nothing from the caller's stream. Python attributes a forward changes are not covered.

`FlopsProfiler` is the training-loop form (DeepSpeed's ``FlopsProfiler``): ``start()`` before a
step's forward captures that call's real inputs, then counts and times it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from . import devices
from .api import analyze
from .attribution import ancestors
from .capture import capture, load
from .errors import ExportFlopsError
from .records import ModuleTiming, NodeTiming, Report, RuntimeProfile, Timing
from .render import flops_report


class ProfileError(ExportFlopsError):
    """The graph cannot be run as asked: no data (meta), devices that disagree, no CUDA, or a
    report without its graph."""


def profile(target: Any, args: Any = None, kwargs: dict | None = None, *,
            device: str | torch.device | None = None, warmup: int = 10, repeat: int = 50,
            peak_flops: float | bool | None = None,
            program: torch.export.ExportedProgram | str | os.PathLike | None = None) -> Report:
    """Count one call and measure it: the `analyze` report with ``runtime`` filled in.

    ``target`` is an ``nn.Module`` (exported once, here), an ``ExportedProgram`` (or the path of
    a saved one), or a `Report`. A report is JSON data and carries no graph: pass the program it
    was analyzed from as ``program=`` (a report analyzed from a saved ``.pt2`` finds it by its
    ``model`` path); its counts are reused, nothing is re-exported, and its node names must be
    the program's.

    ``args``/``kwargs`` are the call's inputs; for a program or a report they default to the
    program's example inputs. ``device`` states where to run: the parameters and the inputs must
    already be there (nothing is moved; the graph may hold device constants). ``peak_flops`` is
    the dense peak in FLOP/s for the MFU; by default it comes from `exportflops.devices` (a GPU's
    datasheet row, or an estimate for the CPU, labelled so), and ``False`` skips the MFU.
    """
    if warmup < 0 or repeat < 1:
        raise ValueError(f"profile() needs warmup >= 0 and repeat >= 1, got warmup={warmup}, "
                         f"repeat={repeat}")
    wanted = _wanted_device(device)
    call = _resolve(target, args, kwargs, program, wanted)
    _check_concrete(call.report)
    graph_module = call.program.module()
    run_on = _check_runnable(graph_module, call.report.model, call.args, call.kwargs, wanted)
    peak = _peak(peak_flops, run_on, call.report)
    _flat_inputs(call.program, call.args, call.kwargs)  # a clear error now for a wrong structure
    plain = call.model if call.model is not None else graph_module
    with _on_copies_of_state(graph_module, plain, run_on):
        measured = _measure(graph_module, plain, call, run_on, warmup, repeat)
    runtime = _runtime_profile(measured, call.report, peak, warmup, repeat)
    return call.report.model_copy(update={"runtime": runtime})


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
    if isinstance(target, torch.nn.Module):
        name = type(target).__name__
        if args is None:
            raise TypeError(f"profile({name}, args) needs the example inputs of the call to time")
        # Checked before exporting: a meta model or split devices fail here, not deep in export.
        _check_runnable(target, name, args, kwargs, wanted)
        captured = capture(target, args, kwargs)
        # analyze() of the program counts the graph just exported (no second export); the
        # report is named after the model, as analyze(model) names it.
        report = analyze(captured.program).model_copy(update={"model": captured.name})
        return _Call(report, captured.program, target, captured.args, captured.kwargs)
    if isinstance(target, Report):
        report, program = target, _program_of(target, program)
        _check_same_graph(report, program)
    elif isinstance(target, torch.export.ExportedProgram):
        program, report = target, analyze(target)
    elif isinstance(target, (str, os.PathLike)):
        # Loaded once; the report is named by the path, as analyze(path) names it.
        program = load(target)
        report = analyze(program).model_copy(update={"model": os.fspath(target)})
    else:
        raise TypeError(f"profile() takes an nn.Module, a torch.export.ExportedProgram (or the "
                        f"path of a saved one) or a Report; got {type(target).__name__}")
    if args is None:
        args, kwargs = _example_inputs(program, report.model)
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    return _Call(report, program, None, args, dict(kwargs or {}))


def _example_inputs(program: torch.export.ExportedProgram, name: str) -> tuple[tuple, dict]:
    if program.example_inputs is None:
        raise ProfileError(f"The program of {name} carries no example inputs: pass the inputs "
                           f"to time, profile(target, args, kwargs).")
    return program.example_inputs


def _wanted_device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(
            f"device={str(device)!r} asks for CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). Profile on "
            f"device='cpu', or run where a GPU is visible."
        )
    if wanted.type not in ("cpu", "cuda"):
        raise ProfileError(f"profile() times on 'cpu' or 'cuda', not {wanted.type!r}")
    if wanted.type == "cuda" and wanted.index is None:
        wanted = torch.device("cuda", torch.cuda.current_device())
    return wanted


def _check_runnable(module: torch.nn.Module, name: str, args: Any, kwargs: dict | None,
                    wanted: torch.device | None) -> torch.device:
    """The one device the call runs on; a clear error for meta tensors or devices that differ."""
    home = _state_device(module, name)
    inputs = [(_input_name(pytree.keystr(path)), leaf)
              for path, leaf in pytree.tree_leaves_with_path((args, kwargs or {}))
              if isinstance(leaf, torch.Tensor)]
    if home is None:
        home = inputs[0][1].device if inputs else torch.device("cpu")
    for where, tensor in inputs:
        if tensor.device.type == "meta":
            raise ProfileError(f"input {where} of {name} is on the meta device: profile() needs "
                               f"real inputs (analyze() counts meta ones)")
        if tensor.device != home:
            raise ProfileError(
                f"input {where} is on {tensor.device} but {name}'s parameters are on {home}: "
                f"move the inputs with .to({str(home)!r}) (or the model with "
                f"model.to({str(tensor.device)!r}))"
            )
    if wanted is not None and wanted != home:
        raise ProfileError(
            f"device={str(wanted)!r} was asked, but {name} and its inputs are on {home}. "
            f"profile() moves nothing (the exported graph can hold device constants): move the "
            f"model and inputs with .to({str(wanted)!r}) before profiling."
        )
    if home.type not in ("cpu", "cuda"):
        raise ProfileError(f"profile() times on 'cpu' or 'cuda'; {name} is on {home}")
    return home


def _state_device(module: torch.nn.Module, name: str) -> torch.device | None:
    """The device of every parameter and buffer (None without any); meta or several devices
    are errors."""
    state = dict((*module.named_parameters(), *module.named_buffers()))
    on_meta = [key for key, tensor in state.items() if tensor.device.type == "meta"]
    if on_meta:
        raise ProfileError(
            f"{name}'s parameters are on the meta device ({on_meta[0]} ...): they have no data "
            f"to run. analyze() counts a meta model; to time it, build it on a real device (or "
            f"model.to_empty(device=...) and initialize it)."
        )
    by_device: dict[str, list[str]] = defaultdict(list)
    for key, tensor in state.items():
        by_device[str(tensor.device)].append(key)
    if len(by_device) > 1:
        listed = "; ".join(f"{d}: {keys[0]}{' ...' if len(keys) > 1 else ''}"
                           for d, keys in by_device.items())
        raise ProfileError(f"{name}'s parameters and buffers are on several devices ({listed}); "
                           f"profile() times one device: move the model with model.to(device)")
    return torch.device(next(iter(by_device))) if by_device else None


def _input_name(keystr: str) -> str:
    # keystr of ((args), {kwargs}): "[0][1]" is positional argument 1, "[1]['mask']" kwarg mask.
    if keystr.startswith("[0]"):
        return f"args{keystr[3:]}"
    return f"kwargs{keystr[3:]}"


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
    in_program = {n.name: _op_name(n.target) for n in program.graph.nodes
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


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return getattr(target, "__name__", str(target))


def _check_concrete(report: Report) -> None:
    if not isinstance(report.total.flops, int):
        raise ProfileError(
            f"The report's counts are expressions of dynamic sizes ({report.total.flops}); a "
            f"measured call has one size. Pass the report evaluated at the inputs' sizes, "
            f"profile(report.evaluate(name=size, ...), args, program=program), or export "
            f"without dynamic_shapes."
        )


def _flat_inputs(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list:
    """The graph's placeholder values: (args, kwargs) flattened as the program's in_spec says."""
    in_spec = program.call_spec.in_spec
    if in_spec is not None and in_spec.num_children == 2:
        kwargs_spec = in_spec.child(1)
        if set(kwargs) == set(kwargs_spec.context or ()):
            kwargs = {k: kwargs[k] for k in kwargs_spec.context}
    flat, spec = pytree.tree_flatten((args, kwargs))
    if in_spec is not None and spec != in_spec:
        raise ProfileError(f"The inputs do not have the structure the program was exported "
                           f"with.\nexpected: {in_spec}\ngot:      {spec}")
    return flat


# --- peak --------------------------------------------------------------------------------------

def _peak(peak_flops: float | bool | None, run_on: torch.device,
          report: Report) -> devices.Peak | None:
    if peak_flops is False:
        return None
    if peak_flops is not None:
        if isinstance(peak_flops, bool) or not peak_flops > 0:
            raise ValueError(f"peak_flops is a dense peak in FLOP/s (> 0), None to look it up, "
                             f"or False for no MFU; got {peak_flops!r}")
        return devices.Peak(float(peak_flops), "user")
    dtype = _compute_dtype(report)
    if run_on.type == "cuda":
        tf32 = torch.get_float32_matmul_precision() != "highest"
        key = devices.matmul_dtype(dtype, tf32=tf32)
        return devices.gpu_peak(torch.cuda.get_device_name(run_on), key)
    ghz, ghz_source = devices.cpu_clock_ghz()
    return devices.cpu_peak(devices.matmul_dtype(dtype, tf32=False),
                            threads=torch.get_num_threads(),
                            capability=torch.backends.cpu.get_cpu_capability(),
                            ghz=ghz, ghz_source=ghz_source)


def _compute_dtype(report: Report) -> str:
    """The dtype of the first input of the nodes holding most of the contraction FLOPs (of all
    FLOPs when nothing contracts): the peak the MFU is measured against."""
    contracting = [n for n in report.nodes if n.cost.macs and n.inputs]
    nodes = contracting or [n for n in report.nodes if n.cost.flops and n.inputs]
    flops: dict[str, int] = defaultdict(int)
    for node in nodes:
        flops[node.inputs[0].dtype] += node.cost.flops
    return max(flops, key=flops.get) if flops else "float32"


# --- timing ------------------------------------------------------------------------------------

@dataclass
class _Measured:
    device: str
    timer: str
    names: list[str]
    node_samples: list[list[float]]
    """Seconds, per timed node, per measured iteration."""
    hooked: list[float]
    plain: list[float]


class _Clock:
    """Per-node and whole-call timing on the CPU: perf_counter_ns, read just around the call."""

    def __init__(self, slots: int) -> None:
        self.starts = [0] * slots
        self.ends = [0] * slots

    def node_start(self, slot: int) -> None:
        self.starts[slot] = time.perf_counter_ns()

    def node_end(self, slot: int) -> None:
        self.ends[slot] = time.perf_counter_ns()

    def whole(self, run: Callable[[], Any]) -> Callable[[], float]:
        start = time.perf_counter_ns()
        run()
        elapsed = (time.perf_counter_ns() - start) / 1e9
        return lambda: elapsed

    def synchronize(self) -> None:
        pass

    def node_seconds(self) -> list[float]:
        return [(e - s) / 1e9 for s, e in zip(self.starts, self.ends)]

    @staticmethod
    def describe() -> str:
        info = time.get_clock_info("perf_counter")
        empty = statistics.median(-time.perf_counter_ns() + time.perf_counter_ns()
                                  for _ in range(1001))
        kind = "monotonic" if info.monotonic else "NOT monotonic"
        return (f"time.perf_counter_ns around each node ({kind}, {info.implementation}, "
                f"resolution {info.resolution:.0e} s, an empty timed region reads {empty:.0f} ns)")


class _CudaClock(_Clock):
    """A pair of CUDA events per node; elapsed times are read after the iteration's one
    synchronize, so the host never waits on the GPU between nodes."""

    def __init__(self, slots: int) -> None:
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(slots)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(slots)]

    def node_start(self, slot: int) -> None:
        self.starts[slot].record()

    def node_end(self, slot: int) -> None:
        self.ends[slot].record()

    def whole(self, run: Callable[[], Any]) -> Callable[[], float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        return lambda: start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def node_seconds(self) -> list[float]:
        return [s.elapsed_time(e) / 1e3 for s, e in zip(self.starts, self.ends)]

    @staticmethod
    def describe() -> str:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(101)]
        for start, end in pairs:
            start.record()
            end.record()
        torch.cuda.synchronize()
        empty = statistics.median(start.elapsed_time(end) * 1e3 for start, end in pairs)
        return (f"a pair of torch.cuda.Event per node, one synchronize per iteration (an empty "
                f"event pair reads {empty:.1f} us)")


class _TimedReplay(torch.fx.Interpreter):
    """Runs the graph node by node; the clock brackets the op call of every timed node."""

    def __init__(self, module: torch.fx.GraphModule, slots: dict[torch.fx.Node, int],
                 clock: _Clock) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.slots, self.clock = slots, clock

    def run_node(self, n: torch.fx.Node) -> Any:
        slot = self.slots.get(n)
        if slot is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        self.clock.node_start(slot)
        out = n.target(*args, **kwargs)
        self.clock.node_end(slot)
        return out


def _measure(graph_module: torch.fx.GraphModule, plain_module: torch.nn.Module, call: _Call,
             run_on: torch.device, warmup: int, repeat: int) -> _Measured:
    timed = _timed_nodes(graph_module, call.report)
    clock = (_CudaClock if run_on.type == "cuda" else _Clock)(len(timed))
    replay = _TimedReplay(graph_module, {n: i for i, n in enumerate(timed)}, clock)
    fresh = _fresh_inputs(graph_module, call.program, call.args, call.kwargs)

    def plain() -> Callable[[], float]:
        a, k, _ = fresh()
        return clock.whole(lambda: plain_module(*a, **k))

    def hooked() -> Callable[[], float]:
        _, _, flat = fresh()
        return clock.whole(lambda: replay.run(*flat, enable_io_processing=False))

    node_samples: list[list[float]] = [[] for _ in timed]
    hooked_s, plain_s = [], []
    for i in range(warmup + repeat):
        if i % 2 == 0:
            plain_time, hooked_time = plain(), hooked()
        else:
            hooked_time, plain_time = hooked(), plain()
        clock.synchronize()  # the iteration's one synchronize; every clock reading is final
        if i < warmup:
            continue
        plain_s.append(plain_time())
        hooked_s.append(hooked_time())
        for samples, seconds in zip(node_samples, clock.node_seconds()):
            samples.append(seconds)
    reference = ("the model's own forward" if call.model is plain_module
                 else "program.module(), no eager model given")
    timer = (f"{clock.describe()}; plain forward: {reference}; autograd "
             f"{'on' if torch.is_grad_enabled() else 'off'}")
    return _Measured(_device_label(run_on), timer, [n.name for n in timed], node_samples,
                     hooked_s, plain_s)


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
                  args: tuple, kwargs: dict) -> Callable[[], tuple[tuple, dict, list]]:
    """The inputs for one run; cloned first (outside the timed region) when the graph writes
    to an input in place, so that every run sees the caller's values."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if not _writes_to(module.graph, set(placeholders)):
        flat = _flat_inputs(program, args, kwargs)
        return lambda: (args, kwargs, flat)

    def clone(x: Any) -> Any:
        return x.clone() if isinstance(x, torch.Tensor) else x

    def fresh() -> tuple[tuple, dict, list]:
        a, k = pytree.tree_map(clone, (args, kwargs))
        return a, k, _flat_inputs(program, a, k)
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


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})"


# --- records -----------------------------------------------------------------------------------

def _timing(samples: list[float]) -> Timing:
    return Timing(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples))


def _rate(flops: int, seconds: float, peak: devices.Peak | None) -> dict[str, float | None]:
    """Achieved FLOP/s and MFU of ``flops`` done in ``seconds``."""
    if seconds <= 0:
        return {"achieved_flop_per_s": None, "mfu": None}
    achieved = flops / seconds
    return {"achieved_flop_per_s": achieved,
            "mfu": None if peak is None else achieved / peak.flop_per_s}


def _runtime_profile(measured: _Measured, report: Report, peak: devices.Peak | None,
                     warmup: int, repeat: int) -> RuntimeProfile:
    records = {n.name: n for n in report.nodes}
    nodes = []
    for name, samples in zip(measured.names, measured.node_samples):
        latency = _timing(samples)
        rate = _rate(records[name].cost.flops, latency.median_s, peak)
        nodes.append(NodeTiming(name=name, module=records[name].module, latency=latency, **rate))
    inclusive: dict[str, float] = defaultdict(float)
    exclusive: dict[str, float] = defaultdict(float)
    for node in nodes:
        exclusive[node.module] += node.latency.median_s
        for path in ancestors(node.module):
            inclusive[path] += node.latency.median_s
    modules = [ModuleTiming(path=m.path, inclusive_s=inclusive[m.path],
                            exclusive_s=exclusive.get(m.path, 0.0),
                            **_rate(m.inclusive.flops, inclusive[m.path], peak))
               for m in report.modules if m.path in inclusive]
    hooked, plain = _timing(measured.hooked), _timing(measured.plain)
    achieved = report.total.flops / plain.median_s
    return RuntimeProfile(
        device=measured.device,
        timer=measured.timer,
        warmup=warmup,
        repeat=repeat,
        nodes=nodes,
        modules=modules,
        hooked_total=hooked,
        plain_total=plain,
        overhead_s=hooked.median_s - plain.median_s,
        residual_s=plain.median_s - inclusive[""],
        peak_flop_per_s=None if peak is None else peak.flop_per_s,
        peak_source="none (peak_flops=False)" if peak is None else peak.source,
        achieved_flop_per_s=achieved,
        mfu=None if peak is None else achieved / peak.flop_per_s,
    )


# --- training loop -----------------------------------------------------------------------------

class FlopsProfiler:
    """Count and time one forward of a training loop, as DeepSpeed's ``FlopsProfiler`` is used::

        prof = FlopsProfiler(model)
        for step, batch in enumerate(loader):
            if step == 3:
                prof.start()
            loss = model(batch).sum()          # this forward is captured, counted and timed
            if step == 3:
                prof.stop()
                print(prof.get_total_flops(), prof.get_total_duration())
                prof.print_model_profile()
                prof.end()
            loss.backward(); opt.step(); opt.zero_grad()

    ``start()`` installs a forward pre-hook and a forward hook on ``model``. The pre-hook keeps a
    copy of the next forward's real inputs; when that forward returns, both hooks are removed
    and `profile` exports the model on those inputs, counts the graph and times it (under the
    forward's grad mode, on copies of the buffers and with the RNG forked, so that the step's
    backward and the rest of training are as without the profiler). If the forward raises, the
    hooks are removed and nothing is analyzed. The profiler stores nothing on the model:
    after ``end()`` (or leaving ``with FlopsProfiler(model) as prof:``) its hooks, attributes
    and state are as before ``start()``.
    """

    def __init__(self, model: torch.nn.Module, *, warmup: int = 3, repeat: int = 10,
                 device: str | torch.device | None = None,
                 peak_flops: float | bool | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"FlopsProfiler wraps an nn.Module, got {type(model).__name__}")
        self.model = model
        self.options = dict(warmup=warmup, repeat=repeat, device=device, peak_flops=peak_flops)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._inputs: tuple[tuple, dict] | None = None
        self._report: Report | None = None

    def __enter__(self) -> FlopsProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def start(self) -> FlopsProfiler:
        """Capture, count and time the model's next forward."""
        if self._handles:
            raise RuntimeError("FlopsProfiler.start() was called twice without stop()")
        self._inputs, self._report = None, None
        self._handles = [
            self.model.register_forward_pre_hook(self._capture, with_kwargs=True),
            self.model.register_forward_hook(self._analyze, with_kwargs=True, always_call=True),
        ]
        return self

    def stop(self) -> None:
        """Remove the hooks (if the forward has not run yet, nothing will be profiled)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._inputs = None

    def end(self) -> None:
        """Remove the hooks and forget the captured inputs; the report stays readable."""
        self.stop()

    @property
    def report(self) -> Report:
        """The report of the captured forward, with its ``runtime``."""
        if self._report is None:
            raise RuntimeError("FlopsProfiler has no profile yet: call start() before the "
                               "model's forward, and read the counts after that forward.")
        return self._report

    def get_total_flops(self) -> int:
        """FLOPs of the captured forward."""
        return self.report.total.flops

    def get_total_macs(self) -> int:
        """Multiply-accumulates of the captured forward."""
        return self.report.total.macs

    def get_total_params(self) -> int:
        """Parameters of the model, tied ones counted once."""
        return self.report.params

    def get_total_duration(self) -> float:
        """Median latency in seconds of the plain forward on the captured inputs."""
        return self.report.runtime.plain_total.median_s

    def print_model_profile(self, *, depth: int = -1, top: int = 3,
                            output_file: str | os.PathLike | None = None, **options: Any) -> str:
        """Print (or write to ``output_file``) `exportflops.render.flops_report` of the capture,
        with each module's ``extra_repr()`` in the tree as DeepSpeed shows it; ``options`` go to
        it (``view=``, ``tablefmt=``, ...). Returns the text."""
        options.setdefault("extra_reprs", {path: m.extra_repr()
                                           for path, m in self.model.named_modules()})
        return flops_report(self.report, depth=depth, top=top, output_file=output_file,
                            print_output=output_file is None, **options)

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        # A copy: the caller may reuse its input buffers in place once the forward returns.
        self._inputs = pytree.tree_map(
            lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, (args, kwargs))

    def _analyze(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = self._inputs
        self.stop()
        if output is None and sys.exc_info()[1] is not None:
            return  # the forward raised: always_call ran this hook only to remove the hooks
        self._report = profile(self.model, inputs[0], inputs[1], **self.options)
