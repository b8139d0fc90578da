"""The roofline of a report on a device: each node's time predicted from its FLOPs and bytes.

For a node on a device with memory bandwidth ``B`` and dense peak ``P`` in the node's dtype:

1. ``compute_s = flops / P``: the FLOPs at the peak;
2. ``memory_s = bytes / B``, bytes being ``bytes_read + bytes_written`` (views move nothing);
3. ``predicted_s = max(compute_s, memory_s)`` (Williams, Waterman and Patterson, "Roofline",
   CACM 2009): the node is ``compute``-bound when step 1 is the larger, else ``memory``-bound;
   equivalently, when its intensity ``flops / bytes`` reaches the ridge point ``P / B``.

A module's prediction is the sum over its nodes (the graph runs them one after another), and so
is the model's. Which peak: a contraction (a node with MACs) runs at the tensor-core peak of its
first input's dtype (`device_table.matmul_dtype`; float32 as TF32 only with ``tf32=True``, torch's
default matmul precision being ``"highest"``); every other op at the vector float32 peak
(float64 ops at the float64 one). Nodes with no count are listed in ``not_predicted``, never
timed as zero. When the report was profiled, each node and module carries its measured median
and ``efficiency = predicted / measured``.

``device="cpu"`` has no datasheet: the bandwidth and the matmul peak of each dtype needed are
measured here, briefly, and the record's ``source`` says so and gives the figures.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from ..device_table import DTYPES, TERA, device_row, matmul_dtype
from .devices import compute_dtype
from ..errors import RooflineError, UnknownDeviceError
from ..aggregate import rolled_up
from ..records import NodeRecord, Report, Roofline, RooflineModule, RooflineNode


def roofline(report: Report, device: str, *, tf32: bool = False) -> Roofline:
    """The `Roofline` of ``report`` on ``device``, a key of the device table (``h100-sxm``,
    ``a100-sxm-80gb``, ...) or ``cpu`` (measured here)."""
    if any(not isinstance(value, int) for value in report.total.model_dump().values()):
        raise RooflineError(
            f"The report of {report.model} counts dynamic sizes "
            f"({', '.join(s.name for s in report.symbols)}): a roofline needs numbers. Call "
            f"exportflops.roofline.roofline(report.evaluate(<size>=<value>), {device!r}).")
    timed = [n for n in report.nodes if n.status in ("counted", "zero")
             and (n.cost.flops or n.cost.bytes_read or n.cost.bytes_written)]
    keys = {n.name: _dtype_key(n, tf32) for n in timed}
    if device == "cpu":
        bandwidth, peaks, source = measure_cpu(sorted(set(keys.values())))
    else:
        row = device_row(device)
        bandwidth = row.bandwidth_bytes_per_s
        peaks = {dtype: tflops * TERA for dtype, tflops in row.dense_tflops.items()}
        source = f"{row.key}: {row.source} ({row.dated})"
    runtime = report.runtime
    measured_nodes = {t.name: t.latency.median_s for t in runtime.nodes} if runtime else {}
    measured_modules = {t.path: t.inclusive_s for t in runtime.modules} if runtime else {}

    nodes = [_node(n, keys[n.name], peaks, bandwidth, device, measured_nodes.get(n.name))
             for n in timed]
    modules = _modules(report, nodes, measured_modules)
    return Roofline(
        model=report.model, device=device, source=source, bandwidth_bytes_per_s=bandwidth,
        peak_flop_per_s=peaks, tf32=tf32, nodes=nodes, modules=modules,
        total=next(m for m in modules if m.path == "") if modules else _empty(),
        not_predicted=[n.name for n in report.nodes if n.status in ("uncounted", "error")],
        measured_on=runtime.device if runtime else "",
    )


def _dtype_key(node: NodeRecord, tf32: bool) -> str:
    tensors = node.inputs or node.outputs
    dtype = tensors[0].dtype if tensors else "float32"
    if node.cost.macs:
        return matmul_dtype(dtype, tf32=tf32)
    return "float64" if dtype == "float64" else "float32"


def _node(node: NodeRecord, dtype: str, peaks: dict[str, float], bandwidth: float, device: str,
          measured_s: float | None) -> RooflineNode:
    if dtype not in peaks:
        raise UnknownDeviceError(
            f"Node {node.name!r} ({node.op}, module {node.module or '<root>'!r}) runs at the "
            f"{dtype} peak, which the table does not list for {device} (it lists "
            f"{', '.join(peaks)}): choose a device with a {dtype} peak, or analyze the model in "
            f"a dtype this device has.")
    flops, moved = node.cost.flops, node.cost.bytes_moved
    compute_s, memory_s = flops / peaks[dtype], moved / bandwidth
    predicted = max(compute_s, memory_s)
    return RooflineNode(
        name=node.name, op=node.op, module=node.module, dtype=dtype,
        peak_flop_per_s=peaks[dtype], ridge_point=peaks[dtype] / bandwidth,
        flops=flops, bytes=moved, intensity=node.cost.intensity, compute_s=compute_s,
        memory_s=memory_s, predicted_s=predicted,
        bound="compute" if compute_s >= memory_s else "memory",
        **_against(predicted, measured_s))


def _modules(report: Report, nodes: list[RooflineNode],
             measured: dict[str, float]) -> list[RooflineModule]:
    """Each module's sums over its nodes and its children's, in the report's module order."""
    own: dict[str, dict[str, float]] = defaultdict(_times)
    for node in nodes:
        _add_times(own[node.module], {
            "compute_s": node.compute_s, "memory_s": node.memory_s,
            "predicted_s": node.predicted_s,
            "compute_bound_s": node.predicted_s if node.bound == "compute" else 0.0})
    sums = rolled_up(own, _add_times, _times)
    modules = []
    for record in report.modules:
        if record.path not in sums:
            continue
        one, cost = sums[record.path], record.inclusive
        modules.append(RooflineModule(
            path=record.path, flops=cost.flops, bytes=cost.bytes_moved,
            intensity=cost.intensity, compute_s=one["compute_s"], memory_s=one["memory_s"],
            predicted_s=one["predicted_s"],
            bound="compute" if 2 * one["compute_bound_s"] >= one["predicted_s"] else "memory",
            **_against(one["predicted_s"], measured.get(record.path))))
    return modules


def _times() -> dict[str, float]:
    return dict.fromkeys(("compute_s", "memory_s", "predicted_s", "compute_bound_s"), 0.0)


def _add_times(total: dict[str, float], times: dict[str, float]) -> dict[str, float]:
    for key, seconds in times.items():
        total[key] += seconds
    return total


def _against(predicted_s: float, measured_s: float | None) -> dict:
    if measured_s is None:
        return {}
    return {"measured_s": measured_s,
            "efficiency": predicted_s / measured_s if measured_s > 0 else None}


def _empty() -> RooflineModule:
    return RooflineModule(path="", flops=0, bytes=0, intensity=None, compute_s=0.0,
                          memory_s=0.0, predicted_s=0.0, bound="memory")


# --- the CPU: measured on the spot -------------------------------------------------------------

#: A copy of 64 MiB (it reads and writes that much): larger than the caches of most CPUs.
_COPY_BYTES = 64 * 2**20
#: Square matmul side: 2 x 1024^3 FLOPs, long enough to reach a CPU's vector peak.
_MATMUL_SIDE = 1024
_REPEATS = 5
_TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32,
                 "bfloat16": torch.bfloat16, "float16": torch.float16}


def measure_cpu(dtypes: list[str]) -> tuple[float, dict[str, float], str]:
    """This CPU's memory bandwidth (bytes/s) and matmul peak (FLOP/s) per dtype key, measured
    now with torch's threads: the best of a few timed copies and matmuls, and a label saying
    so. A measured peak is what torch reaches here, not the silicon's datasheet figure."""
    unknown = [d for d in dtypes if d not in _TORCH_DTYPES]
    if unknown:
        raise UnknownDeviceError(
            f"No {', '.join(unknown)} matmul to measure on the CPU (measured dtypes: "
            f"{', '.join(_TORCH_DTYPES)}; the table's are {', '.join(DTYPES)}).")
    source = torch.empty(_COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
    target = torch.empty_like(source)
    copy_s = _best(lambda: target.copy_(source))
    bandwidth = 2 * _COPY_BYTES / copy_s  # read once, written once
    peaks, parts = {}, []
    for dtype in dtypes:
        a = torch.ones(_MATMUL_SIDE, _MATMUL_SIDE, dtype=_TORCH_DTYPES[dtype])
        seconds = _best(lambda: torch.mm(a, a))
        peaks[dtype] = 2 * _MATMUL_SIDE**3 / seconds
        parts.append(f"{dtype} mm {_MATMUL_SIDE}^3 {peaks[dtype] / 1e9:.1f} GFLOP/s")
    label = (f"measured on this CPU, {torch.get_num_threads()} threads, best of {_REPEATS}: "
             f"copy of {_COPY_BYTES >> 20} MiB {bandwidth / 1e9:.1f} GB/s; {'; '.join(parts)}")
    return bandwidth, peaks, label


def _best(run) -> float:
    run()  # warm-up: page faults and lazy initialization
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter_ns()
        run()
        times.append((time.perf_counter_ns() - start) / 1e9)
    return min(times)


def device_roofs(key: str, report: Report) -> tuple[dict[str, float], float]:
    """The roofs of the table row ``key`` for ``report``: its dense peak in the dtype that does
    most of the report's contractions (`compute_dtype`; float32 as TF32 unless torch's
    float32 matmul precision is ``"highest"``, as `devices.mfu_peak` has it), and its memory
    bandwidth in bytes/s (the memory roof)."""
    row = device_row(key)
    tf32 = torch.get_float32_matmul_precision() != "highest"
    dtype = matmul_dtype(compute_dtype(report), tf32=tf32)
    if dtype not in row.dense_tflops:
        raise UnknownDeviceError(f"The table has no dense {dtype} peak for {key} (it lists "
                                 f"{', '.join(row.dense_tflops)}): no compute roof to draw.")
    tflops = row.dense_tflops[dtype]
    peaks = {f"{key} {dtype} dense {tflops:g} TFLOP/s": tflops * TERA}
    return peaks, row.bandwidth_bytes_per_s
