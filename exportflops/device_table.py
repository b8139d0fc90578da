"""The device table: one sourced, dated row per device (dense peak FLOP/s per dtype, memory
bandwidth, memory), as data, and the lookups by key and by the name the driver reports. Keys are
short lowercase names (``h100-sxm``, ``a100-sxm-80gb``).

Every figure is the *dense* tensor-core (or vector) peak of the datasheet. NVIDIA prints the
Hopper, Ada and Ampere tensor-core figures with 2:4 structured sparsity (marked ``*``, "with
sparsity"); where the datasheet prints only that figure, the dense one is half of it, and the
row keeps the printed sparse number inside the halving so that the trap stays visible (the H100
datasheet, https://www.nvidia.com/en-us/data-center/h100/, prints SXM bf16 as "1,979
teraFLOPS*": dense 989.5). Where it prints both, the row takes the printed dense figure.

A device is found by the exact name ``torch.cuda.get_device_name()`` reports, matched against a
whole-name pattern, never a substring: an unknown name (another variant, a MIG slice, a new GPU)
is an `UnknownDeviceError` naming ``peak_flop_per_s=``, not a fallback to a row that looks
close.

The table imports no torch and sits below ``records`` (a `MemoryReport` reads a row's memory)
and ``roofline`` (`exportflops.roofline.devices`: the peaks an MFU and a roofline use).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import UnknownDeviceError

TERA = 1e12
#: The date the rows' figures were checked against public copies of the datasheet tables (the
#: vendor's pages could not be reached from where the check ran); verify against the source URL.
_CHECKED = "checked 2026-11-23"

#: Dtype keys of the table. ``tf32`` is float32 matmul on tensor cores; `matmul_dtype` picks it.
DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16", "float8")


def sparse_to_dense(sparse_tflops: float) -> float:
    """Dense TFLOPS from a datasheet figure printed with 2:4 sparsity: half of it."""
    return sparse_tflops / 2


@dataclass(frozen=True)
class Device:
    """One device of the table."""

    key: str
    """Short name, e.g. ``h100-sxm``, ``a100-sxm-80gb``."""
    names: str
    """Regular expression matched against the whole ``torch.cuda.get_device_name()``."""
    dense_tflops: Mapping[str, float]
    """Dense peak in TFLOP/s per dtype key of `DTYPES`; a dtype absent here has no peak."""
    bandwidth_gb_s: float
    """Peak memory bandwidth in GB/s (10^9 bytes per second), as the datasheet prints it."""
    memory_gb: float | None
    """The board's memory as the datasheet prints it ("GPU Memory 80GB"), read as 10^9 bytes:
    NVIDIA does not say which GB it means, and the decimal reading never overstates (a board
    holds at least that many bytes; ``torch.cuda.get_device_properties(i).total_memory`` is
    one board's exact figure: 42,405,855,232 bytes for an A100 40GB, as CUDA's deviceQuery prints
    it). Checked 2026-12-01 against public copies of each datasheet's table. None where one row
    covers boards of different memory."""
    source: str
    """Datasheet the figures come from: its name and URL."""
    dated: str
    """Which edition of the source the figures were read from, or when they were checked."""

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gb_s * 1e9

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gb is None else int(self.memory_gb * 1e9)


#: The four A100 boards share the datasheet's peaks and differ in memory bandwidth.
_A100_DENSE = {
    "float64": 19.5,  # FP64 Tensor Core
    "float32": 19.5,
    "tf32": 156,  # printed "156 TF | 312 TF*"
    "bfloat16": 312,  # printed "312 TF | 624 TF*"
    "float16": 312,
}
_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-"
                "r4-web.pdf), https://www.nvidia.com/en-us/data-center/a100/")
_A100_DATED = "datasheet r4 (the file named), checked 2026-11-23"


DEVICES: tuple[Device, ...] = (
    *(Device(
        key=f"a100-{board}-{gb}gb",
        names=name,
        dense_tflops=_A100_DENSE,
        bandwidth_gb_s=bandwidth,  # "GPU Memory Bandwidth", per board
        memory_gb=gb,  # "GPU Memory 40GB HBM2 | 80GB HBM2e", per board
        source=_A100_SOURCE,
        dated=_A100_DATED,
    ) for board, gb, name, bandwidth in (
        ("sxm", 40, "NVIDIA A100-SXM4-40GB", 1555),
        ("sxm", 80, "NVIDIA A100-SXM4-80GB", 2039),
        ("pcie", 40, "NVIDIA A100-PCIE-40GB", 1555),
        ("pcie", 80, "NVIDIA A100 80GB PCIe", 1935),
    )),
    Device(
        key="h100-sxm",
        names=r"NVIDIA H100 80GB HBM3",
        dense_tflops={
            "float64": 67,  # FP64 Tensor Core
            "float32": 67,
            "tf32": sparse_to_dense(989),  # printed "989 teraFLOPS*"
            "bfloat16": sparse_to_dense(1979),  # printed "1,979 teraFLOPS*"
            "float16": sparse_to_dense(1979),
            "float8": sparse_to_dense(3958),  # printed "3,958 teraFLOPS*"
        },
        bandwidth_gb_s=3350,  # "GPU memory bandwidth 3.35TB/s"
        memory_gb=80,  # "GPU memory 80GB"
        source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (* with sparsity), "
               "https://www.nvidia.com/en-us/data-center/h100/",
        dated=_CHECKED,
    ),
    Device(
        key="h100-pcie",
        names=r"NVIDIA H100 PCIe",
        dense_tflops={
            "float64": 51,  # FP64 Tensor Core
            "float32": 51,
            "tf32": sparse_to_dense(756),  # printed "756 teraFLOPS*"
            "bfloat16": sparse_to_dense(1513),  # printed "1,513 teraFLOPS*"
            "float16": sparse_to_dense(1513),
            "float8": sparse_to_dense(3026),  # printed "3,026 teraFLOPS*"
        },
        bandwidth_gb_s=2000,  # "GPU memory bandwidth 2TB/s"
        memory_gb=80,  # "GPU memory 80GB"
        source="NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column (* with sparsity), "
               "https://www.nvidia.com/en-us/data-center/h100/",
        dated=_CHECKED,
    ),
    Device(
        key="h200-sxm",
        # H200 SXM: the H100 SXM compute with 141 GB of HBM3e. "NVIDIA H200 NVL" is another
        # board with lower peaks and does not match.
        names=r"NVIDIA H200",
        dense_tflops={
            "float64": 67,  # FP64 Tensor Core
            "float32": 67,
            "tf32": sparse_to_dense(989),  # printed "989 TFLOPS*"
            "bfloat16": sparse_to_dense(1979),  # printed "1,979 TFLOPS*"
            "float16": sparse_to_dense(1979),
            "float8": sparse_to_dense(3958),  # printed "3,958 TFLOPS*"
        },
        bandwidth_gb_s=4800,  # "GPU memory bandwidth 4.8TB/s"
        memory_gb=141,  # "GPU memory 141GB"
        source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (* with sparsity), "
               "https://www.nvidia.com/en-us/data-center/h200/",
        dated=_CHECKED,
    ),
    Device(
        key="l4",
        names=r"NVIDIA L4",
        dense_tflops={
            "float32": 30.3,
            "tf32": sparse_to_dense(120),  # printed "120 teraFLOPS*"
            "bfloat16": sparse_to_dense(242),  # printed "242 teraFLOPS*"
            "float16": sparse_to_dense(242),
            "float8": sparse_to_dense(485),  # printed "485 teraFLOPS*"
        },
        bandwidth_gb_s=300,  # "GPU memory bandwidth 300GB/s"
        memory_gb=24,  # "GPU memory 24GB"
        source="NVIDIA L4 Tensor Core GPU datasheet (* shown with sparsity), "
               "https://www.nvidia.com/en-us/data-center/l4/",
        dated=_CHECKED,
    ),
    Device(
        key="l40s",
        names=r"NVIDIA L40S",
        dense_tflops={
            "float32": 91.6,
            "tf32": 183,  # printed "183 | 366*"
            # Printed "362.05 | 733*": the dense figure is printed, and it is not half of the
            # sparse one (366.5); the printed dense figure is the peak.
            "bfloat16": 362.05,
            "float16": 362.05,
            "float8": 733,  # printed "733 | 1,466*"
        },
        bandwidth_gb_s=864,  # "GPU memory bandwidth 864GB/s"
        memory_gb=48,  # "GPU memory 48GB GDDR6 with ECC"
        source="NVIDIA L40S GPU datasheet (* with sparsity), "
               "https://www.nvidia.com/en-us/data-center/l40s/",
        dated=_CHECKED,
    ),
    Device(
        key="a10",
        names=r"NVIDIA A10",
        dense_tflops={
            "float32": 31.2,
            "tf32": 62.5,  # printed "62.5 TF | 125 TF*"
            "bfloat16": 125,  # printed "125 TF | 250 TF*"
            "float16": 125,
        },
        bandwidth_gb_s=600,  # "GPU memory bandwidth 600GB/s"
        memory_gb=24,  # "GPU memory 24GB GDDR6"
        source="NVIDIA A10 Tensor Core GPU datasheet (* with sparsity), "
               "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
        dated=_CHECKED,
    ),
    Device(
        key="v100-sxm2",
        # Volta has no bfloat16 or TF32 tensor cores: those dtypes have no peak here.
        names=r"Tesla V100-SXM2-(16|32)GB",
        dense_tflops={"float64": 7.8, "float32": 15.7, "float16": 125},  # "Tensor Performance"
        bandwidth_gb_s=900,  # "Memory Bandwidth 900GB/sec"
        memory_gb=None,  # the row covers both boards: "GPU Memory 32/16 GB HBM2"
        source="NVIDIA Tesla V100 GPU datasheet, V100 SXM2 column, "
               "https://www.nvidia.com/en-us/data-center/v100/",
        dated=_CHECKED,
    ),
    Device(
        key="t4",
        names=r"Tesla T4",
        dense_tflops={"float32": 8.1, "float16": 65},  # "Mixed Precision (FP16/FP32)"
        bandwidth_gb_s=320,  # printed "320+ GB/sec": the floor of the figure
        memory_gb=16,  # "GPU memory 16 GB GDDR6"
        source="NVIDIA T4 Tensor Core GPU datasheet, "
               "https://www.nvidia.com/en-us/data-center/tesla-t4/",
        dated=_CHECKED,
    ),
)


def lookup(device_name: str) -> Device:
    """The row whose pattern matches the whole device name; `UnknownDeviceError` otherwise."""
    for device in DEVICES:
        if re.fullmatch(device.names, device_name.strip()):
            return device
    raise UnknownDeviceError(
        f"No dense peak FLOP/s is known for {device_name!r}. Pass peak_flop_per_s=<dense FLOP/s "
        f"from its datasheet> (half of a figure printed with sparsity), e.g. "
        f"peak_flop_per_s=312e12 for an A100 in bfloat16, or peak_flop_per_s=False to measure "
        f"latency without MFU. Known "
        f"devices: {', '.join(d.key for d in DEVICES)}."
    )


def device_row(key: str) -> Device:
    """The row of a short device key such as ``h100-sxm``; `UnknownDeviceError` otherwise."""
    for device in DEVICES:
        if device.key == key:
            return device
    raise UnknownDeviceError(f"No device {key!r} in the table; its keys are "
                             f"{', '.join(d.key for d in DEVICES)} (and cpu, measured here).")


def matmul_dtype(dtype: str, *, tf32: bool) -> str:
    """The table key for a contraction in ``dtype``: float32 runs as ``tf32`` when allowed,
    every float8 variant is ``float8``."""
    if dtype == "float32" and tf32:
        return "tf32"
    if dtype.startswith("float8"):
        return "float8"
    return dtype
