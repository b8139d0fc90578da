"""A measured report as a Chrome/Perfetto trace: one complete event per timed node, inside
module slices that nest exactly.

The timeline is the report's own numbers, laid out: the timed nodes follow each other in graph
order, each as long as its median latency (`NodeTiming.latency`), with no gap between them. A
module's slice spans a run of consecutive nodes that ran in it or under it, so every slice is
the sum of the node events inside it, the same sum `ModuleTiming` takes; a module whose nodes
are interleaved with another's (a module called twice) has one slice per run. What no node
accounts for (``RuntimeProfile.residual_s``: Python between ops, module calls) is not drawn.

Times are integer nanoseconds, written as microseconds with three decimals (the trace format's
unit), so that a child never ends past its parent by a rounding.

Each node event carries its counts in ``args`` (``flops``, ``macs``, ``bytes_read``,
``bytes_written``) and under the names torch's profiler and
``torch._inductor.analysis.profile_analysis`` read: ``kernel_flop`` (FLOPs) and
``kernel_num_gb`` (bytes read + written, in GB of 1e9 bytes). Node events have category
``kernel`` and a ``deviceProperties`` entry, which is what that reader computes achieved FLOP/s
and bandwidth from.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import NotMeasuredError
from ..records.names import ancestors
from ..records import NodeRecord, NodeTiming, Report

#: The trace format's timestamps are microseconds; the layout works in integer nanoseconds.
_NS_PER_US = 1000
_BYTES_PER_GB = 1e9


def trace_events(report: Report) -> dict[str, Any]:
    """The Chrome trace (JSON object format) of a measured report."""
    runtime = _runtime_of(report)
    counts = {n.name: n for n in report.nodes}
    types = {m.path: m.type for m in report.modules}
    events: list[dict[str, Any]] = []
    open_slices: list[dict[str, Any]] = []  # the slices around the current node, outermost first
    now = 0
    for timed in runtime.nodes:
        stack = ancestors(timed.module)
        shared = _shared_prefix([s["args"]["module"] for s in open_slices], stack)
        for finished in open_slices[shared:]:
            finished["dur"] = now - finished["ts"]
        del open_slices[shared:]
        for path in stack[shared:]:
            open_slices.append(_module_slice(report, path, types.get(path, ""), now))
            events.append(open_slices[-1])
        duration = round(timed.latency.median_s * 1e9)
        events.append(_node_event(counts[timed.name], timed, now, duration))
        now += duration
    for finished in open_slices:
        finished["dur"] = now - finished["ts"]
    for event in events:
        event["ts"] = event["ts"] / _NS_PER_US
        event["dur"] = event["dur"] / _NS_PER_US
    name = f"exportflops: {report.model}"
    return {
        "traceEvents": [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0,
             "args": {"name": f"{runtime.device}: median latency per node, end to end"}},
            *events,
        ],
        "displayTimeUnit": "ns",
        "deviceProperties": [{"id": 0, "name": _device_name(runtime.device)}],
        "otherData": {
            "model": report.model,
            "device": runtime.device,
            "timer": runtime.timer,
            "warmup": runtime.warmup,
            "repeat": runtime.repeat,
            "layout": "each timed node for its median latency, in graph order, end to end; "
                      "module slices span their nodes; the residual between nodes "
                      f"({runtime.residual_s:.3e} s) is not drawn",
        },
    }


def to_trace(report: Report) -> str:
    """The trace of a measured report (``exportflops.profile``) as JSON text, for Perfetto
    (ui.perfetto.dev) or chrome://tracing: write it to a ``.json`` file."""
    return json.dumps(trace_events(report))


def _runtime_of(report: Report):
    if report.runtime is None:
        raise NotMeasuredError(f"The report of {report.model} holds no timings to draw as a trace: "
                         f"measure it with exportflops.profile(model, args) (on the command, "
                         f"--profile --device cpu|cuda --trace FILE).")
    return report.runtime


def _shared_prefix(open_paths: list[str], stack: list[str]) -> int:
    shared = 0
    for a, b in zip(open_paths, stack):
        if a != b:
            break
        shared += 1
    return shared


def _module_slice(report: Report, path: str, type_: str, start_ns: int) -> dict[str, Any]:
    return {"name": path or report.model, "cat": "module", "ph": "X", "ts": start_ns, "dur": 0,
            "pid": 0, "tid": 0, "args": {"module": path, "type": type_}}


def _node_event(node: NodeRecord, timed: NodeTiming, start_ns: int,
                duration_ns: int) -> dict[str, Any]:
    cost = node.cost
    latency = timed.latency
    event = {
        "name": node.name, "cat": "kernel", "ph": "X", "ts": start_ns, "dur": duration_ns,
        "pid": 0, "tid": 0,
        "args": {
            "name": node.op, "op": node.op, "module": node.module, "status": node.status,
            "device": 0,
            "flops": cost.flops, "macs": cost.macs,
            "bytes_read": cost.bytes_read, "bytes_written": cost.bytes_written,
            "median_s": latency.median_s, "min_s": latency.min_s, "max_s": latency.max_s,
            "achieved_flop_per_s": timed.achieved_flop_per_s,
        },
    }
    if duration_ns > 0:
        # torch's names; its reader divides them by the duration (and asserts it is not 0), so
        # a node that read 0 on the clock (a view, under a CUDA event's resolution) has none.
        event["args"]["kernel_flop"] = cost.flops
        event["args"]["kernel_num_gb"] = cost.bytes_moved / _BYTES_PER_GB
    return event


def _device_name(device: str) -> str:
    """The name a reader matches device tables by: the GPU's own name in
    ``cuda:0 (NVIDIA H100 80GB HBM3)``, else the label as the runtime wrote it."""
    if device.startswith("cuda") and device.endswith(")") and " (" in device:
        return device[device.index(" (") + 2:-1]
    return device
