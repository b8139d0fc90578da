"""The peak an MFU or a roofline uses, from the device table (`exportflops.device_table`: one
sourced, dated row per device) or, for the CPU, estimated here.

The CPU has no datasheet row: `cpu_peak` derives an *estimate* from the thread count, the clock
and the vector width, and says so in its source.

`device_peak` is the one rule for a peak nobody gave, used by every MFU (`exportflops.profile`,
the trainers' helpers in `exportflops.training`): a CUDA device's row, the CPU's estimate
(labelled ``estimated`` wherever the MFU is shown), and for any other device an
`UnknownDeviceError` naming ``peak_flop_per_s=``. `mfu_peak` applies it to a measured report.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import torch

from ..device_table import TERA, lookup, matmul_dtype
from ..errors import UnknownDeviceError
from ..records import Report


class Peak(NamedTuple):
    flop_per_s: float
    source: str
    """The row (or the derivation, for an estimate) the figure comes from."""
    estimated: bool = False
    """True for the CPU's estimate (`cpu_peak`): derived here, not read from a datasheet."""
    device: str = "user"
    """The table's key of the row (``h100-sxm``), ``cpu`` for the estimate, ``user`` for a
    figure given."""


def gpu_peak(device_name: str, dtype: str) -> Peak:
    """Dense peak of a GPU for a table dtype key (see `matmul_dtype`)."""
    device = lookup(device_name)
    if dtype not in device.dense_tflops:
        raise UnknownDeviceError(
            f"The table has no dense {dtype} peak for {device_name!r} ({device.key}; it lists "
            f"{', '.join(device.dense_tflops)}). Pass peak_flop_per_s=<dense FLOP/s> or "
            f"peak_flop_per_s=False to measure latency without MFU."
        )
    tflops = device.dense_tflops[dtype]
    return Peak(tflops * TERA, f"{device.key} {dtype} dense {tflops:g} TFLOP/s, {device.source}",
                device=device.key)


# fp32 lanes of one vector register per torch CPU capability. Two FMA units per core and 2 FLOPs
# per lane per FMA are assumptions of the estimate (true of most server x86 cores since Haswell;
# some parts have one 512-bit FMA unit, which halves the AVX512 figure).
_FP32_LANES = {"AVX2": 8, "AVX512": 16}
_FMA_UNITS = 2
_FLOPS_PER_FMA = 2


def cpu_peak(dtype: str, *, threads: int, capability: str, ghz: float | None,
             ghz_source: str = "") -> Peak:
    """An *estimate* of the CPU's peak: threads x GHz x FLOPs per cycle of its vector units.

    float64 has half the lanes; bfloat16 and float16 are taken at the float32 rate (AMX and
    AVX512-BF16 are not modelled). Hyperthreads share a core's FMA units, so with more threads
    than physical cores the estimate is high.
    """
    if capability not in _FP32_LANES or not ghz:
        raise UnknownDeviceError(
            f"Cannot estimate this CPU's peak (torch CPU capability {capability!r}, clock "
            f"{'unknown' if not ghz else f'{ghz:g} GHz'}). Pass peak_flop_per_s=<FLOP/s> or "
            f"peak_flop_per_s=False to measure latency without MFU."
        )
    lanes = _FP32_LANES[capability] // (2 if dtype == "float64" else 1)
    lane_dtype = "float64" if dtype == "float64" else "float32"
    per_cycle = lanes * _FMA_UNITS * _FLOPS_PER_FMA
    flop_per_s = threads * ghz * 1e9 * per_cycle
    return Peak(flop_per_s, estimated=True, device="cpu", source=(
        f"estimate, not a datasheet figure: {threads} threads x {ghz:g} GHz ({ghz_source}) x "
        f"{per_cycle} FLOP/cycle ({capability}: {lanes} {lane_dtype} lanes x {_FMA_UNITS} FMA "
        f"units (assumed) x {_FLOPS_PER_FMA}) = "
        f"{flop_per_s / 1e9:.0f} GFLOP/s"
    ))


def cpu_clock_ghz() -> tuple[float | None, str]:
    """The CPU's maximum clock if the kernel reports one, else the current clock of cpu0."""
    max_freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(max_freq.read_text()) / 1e6, "cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1e3, "current clock from /proc/cpuinfo"
    except (OSError, ValueError, IndexError):
        pass
    return None, ""


# --- which peak an MFU is measured against -----------------------------------------------------

def mfu_peak(peak_flop_per_s: float | bool | None, run_on: torch.device,
             report: Report) -> Peak | None:
    """The dense peak that the MFU of ``report``, run on ``run_on``, is measured against: the
    user's figure (checked by the caller), none for ``False``, else `device_peak` in the dtype
    that does most of the work (`compute_dtype`)."""
    if peak_flop_per_s is False:
        return None
    if peak_flop_per_s is not None:
        return Peak(float(peak_flop_per_s), "user")
    # float32 matmuls run on TF32 tensor cores unless the precision is "highest".
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return device_peak(run_on, matmul_dtype(compute_dtype(report), tf32=tf32))


def device_peak(run_on: torch.device, dtype: str) -> Peak:
    """The dense peak of the device a run is on, for a table dtype key (`matmul_dtype`): the
    table's row of a CUDA device's name, the estimate for the CPU (``estimated``: float32
    contractions have no TF32 there), and for any other device an `UnknownDeviceError`."""
    if run_on.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(run_on), dtype)
    if run_on.type == "cpu":
        ghz, ghz_source = cpu_clock_ghz()
        return cpu_peak("float32" if dtype == "tf32" else dtype,
                        threads=torch.get_num_threads(),
                        capability=torch.backends.cpu.get_cpu_capability(), ghz=ghz,
                        ghz_source=ghz_source)
    raise UnknownDeviceError(
        f"No dense peak FLOP/s is known for a {run_on.type} device: the table holds CUDA "
        f"devices, and the CPU's peak is estimated. Pass peak_flop_per_s=<dense FLOP/s from "
        f"its datasheet>, or peak_flop_per_s=False for the rate without MFU.")


def compute_dtype(report: Report) -> str:
    """The dtype of the first input of the nodes holding most of the contraction FLOPs (of all
    FLOPs when nothing contracts): contractions run at the peak the MFU is about, and a model
    that contracts in bfloat16 is measured against the bfloat16 peak even if its norms run in
    float32."""
    contracting = [n for n in report.nodes if n.cost.macs and n.inputs]
    nodes = contracting or [n for n in report.nodes if n.cost.flops and n.inputs]
    flops: dict[str, int] = defaultdict(int)
    for node in nodes:
        flops[node.inputs[0].dtype] += node.cost.flops
    return max(flops, key=flops.get) if flops else "float32"
