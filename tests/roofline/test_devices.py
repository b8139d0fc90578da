"""The peak table against its datasheets, the sparse -> dense halving, refused names and dtypes,
and the CPU estimate's arithmetic.

The trap: NVIDIA prints Hopper, Ada and Ampere tensor-core figures with 2:4 sparsity (H100 SXM
bf16 "1,979 teraFLOPS*", https://www.nvidia.com/en-us/data-center/h100/); the dense peak is
half (989.5). Where a datasheet prints both, the dense one is read directly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.roofline import devices
from exportflops.errors import UnknownDeviceError
from exportflops.device_table import DEVICES, lookup, matmul_dtype, sparse_to_dense
from exportflops.roofline.devices import compute_dtype, cpu_peak, gpu_peak, mfu_peak

TERA = 1e12

A100_BOARDS = ("a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb")

# Transcribed from the datasheet each row cites (its `source`): the figure as printed ("*": with
# sparsity) and the dense peak in TFLOP/s that follows from it.
PRINTED = [
    # NVIDIA A100 datasheet (its four columns, 40/80 GB SXM4 and PCIe, agree on these)
    *((a100, dtype, printed, dense) for a100 in A100_BOARDS for dtype, printed, dense in (
        ("float64", "FP64 Tensor Core 19.5 TF", 19.5),
        ("float32", "FP32 19.5 TF", 19.5),
        ("tf32", "156 TF | 312 TF*", 156),
        ("bfloat16", "312 TF | 624 TF*", 312),
        ("float16", "312 TF | 624 TF*", 312))),
    # NVIDIA H100 datasheet, H100 SXM column
    ("h100-sxm", "float64", "FP64 Tensor Core 67", 67),
    ("h100-sxm", "float32", "FP32 67", 67),
    ("h100-sxm", "tf32", "989*", 989 / 2),
    ("h100-sxm", "bfloat16", "1,979*", 1979 / 2),
    ("h100-sxm", "float16", "1,979*", 1979 / 2),
    ("h100-sxm", "float8", "3,958*", 3958 / 2),
    # NVIDIA H100 datasheet, H100 PCIe column
    ("h100-pcie", "float64", "FP64 Tensor Core 51", 51),
    ("h100-pcie", "float32", "FP32 51", 51),
    ("h100-pcie", "tf32", "756*", 756 / 2),
    ("h100-pcie", "bfloat16", "1,513*", 1513 / 2),
    ("h100-pcie", "float16", "1,513*", 1513 / 2),
    ("h100-pcie", "float8", "3,026*", 3026 / 2),
    # NVIDIA H200 datasheet, H200 SXM column
    ("h200-sxm", "float64", "FP64 Tensor Core 67", 67),
    ("h200-sxm", "float32", "FP32 67", 67),
    ("h200-sxm", "tf32", "989*", 989 / 2),
    ("h200-sxm", "bfloat16", "1,979*", 1979 / 2),
    ("h200-sxm", "float16", "1,979*", 1979 / 2),
    ("h200-sxm", "float8", "3,958*", 3958 / 2),
    # NVIDIA L4 datasheet (tensor figures printed with sparsity only)
    ("l4", "float32", "FP32 30.3", 30.3),
    ("l4", "tf32", "120*", 120 / 2),
    ("l4", "bfloat16", "242*", 242 / 2),
    ("l4", "float16", "242*", 242 / 2),
    ("l4", "float8", "485*", 485 / 2),
    # NVIDIA L40S datasheet: the printed dense bf16 is 362.05, not half of 733 (366.5)
    ("l40s", "float32", "FP32 91.6", 91.6),
    ("l40s", "tf32", "183 | 366*", 183),
    ("l40s", "bfloat16", "362.05 | 733*", 362.05),
    ("l40s", "float16", "362.05 | 733*", 362.05),
    ("l40s", "float8", "733 | 1,466*", 733),
    # NVIDIA A10 datasheet
    ("a10", "float32", "FP32 31.2 TF", 31.2),
    ("a10", "tf32", "62.5 TF | 125 TF*", 62.5),
    ("a10", "bfloat16", "125 TF | 250 TF*", 125),
    ("a10", "float16", "125 TF | 250 TF*", 125),
    # NVIDIA V100 datasheet, SXM2 column (Volta: no bf16 or TF32 tensor cores)
    ("v100-sxm2", "float64", "Double-Precision 7.8", 7.8),
    ("v100-sxm2", "float32", "Single-Precision 15.7", 15.7),
    ("v100-sxm2", "float16", "Tensor Performance 125", 125),
    # NVIDIA T4 datasheet
    ("t4", "float32", "Single-Precision 8.1", 8.1),
    ("t4", "float16", "Mixed-Precision (FP16/FP32) 65", 65),
]
ROWS = {device.key: device for device in DEVICES}


@pytest.mark.parametrize(("key", "dtype", "printed", "dense_tflops"), PRINTED,
                         ids=[f"{key}-{dtype}" for key, dtype, _, _ in PRINTED])
def test_each_dense_peak_matches_its_datasheet(key, dtype, printed, dense_tflops):
    assert ROWS[key].dense_tflops[dtype] == pytest.approx(dense_tflops, rel=1e-12), printed


def test_every_figure_of_the_table_is_transcribed_here():
    """A row or dtype added to the table without its datasheet figure above fails here."""
    in_table = {(d.key, dtype) for d in DEVICES for dtype in d.dense_tflops}
    assert in_table == {(key, dtype) for key, dtype, _, _ in PRINTED}


def test_every_row_cites_an_nvidia_datasheet():
    for device in DEVICES:
        assert "datasheet" in device.source and "https://www.nvidia.com/" in device.source, \
            device.key


# Memory bandwidth as each datasheet prints it ("GPU memory bandwidth"), in GB/s.
BANDWIDTH = [
    ("a100-sxm-40gb", "1,555GB/s", 1555), ("a100-sxm-80gb", "2,039GB/s", 2039),
    ("a100-pcie-40gb", "1,555GB/s", 1555), ("a100-pcie-80gb", "1,935GB/s", 1935),
    ("h100-sxm", "3.35TB/s", 3350), ("h100-pcie", "2TB/s", 2000), ("h200-sxm", "4.8TB/s", 4800),
    ("l4", "300GB/s", 300), ("l40s", "864GB/s", 864), ("a10", "600GB/s", 600),
    ("v100-sxm2", "900GB/sec", 900), ("t4", "320+ GB/s", 320),
]


@pytest.mark.parametrize(("key", "printed", "gb_s"), BANDWIDTH, ids=[b[0] for b in BANDWIDTH])
def test_each_bandwidth_matches_its_datasheet(key, printed, gb_s):
    assert ROWS[key].bandwidth_gb_s == gb_s, printed
    assert ROWS[key].bandwidth_bytes_per_s == gb_s * 1e9


# Memory as each datasheet prints it ("GPU Memory"), in GB; None: the row covers boards of two
# sizes (V100 SXM2 "32/16 GB HBM2").
MEMORY = [
    ("a100-sxm-40gb", "40GB HBM2", 40), ("a100-sxm-80gb", "80GB HBM2e", 80),
    ("a100-pcie-40gb", "40GB HBM2", 40), ("a100-pcie-80gb", "80GB HBM2e", 80),
    ("h100-sxm", "80GB", 80), ("h100-pcie", "80GB", 80), ("h200-sxm", "141GB", 141),
    ("l4", "24GB", 24), ("l40s", "48GB GDDR6 with ECC", 48), ("a10", "24GB GDDR6", 24),
    ("v100-sxm2", "32/16 GB HBM2", None), ("t4", "16 GB GDDR6", 16),
]


@pytest.mark.parametrize(("key", "printed", "gb"), MEMORY, ids=[m[0] for m in MEMORY])
def test_each_memory_matches_its_datasheet_read_as_decimal_gb(key, printed, gb):
    assert ROWS[key].memory_gb == gb, printed
    assert ROWS[key].memory_bytes == (None if gb is None else gb * 10**9)


def test_every_row_has_its_memory_transcribed():
    assert set(ROWS) == {key for key, _, _ in MEMORY}


def test_every_row_has_its_bandwidth_transcribed_and_is_dated():
    assert set(ROWS) == {key for key, _, _ in BANDWIDTH}
    assert all(device.dated for device in DEVICES)


def test_a_sparse_figure_is_halved():
    """H100 SXM bf16 is printed as 1,979 TFLOPS with sparsity; dense is 989.5.

    Source: the H100 datasheet, https://www.nvidia.com/en-us/data-center/h100/."""
    assert sparse_to_dense(1979) == 989.5


def test_the_peak_names_its_row_and_says_dense():
    peak = gpu_peak("NVIDIA H100 80GB HBM3", "bfloat16")
    assert peak.flop_per_s == 989.5 * TERA
    assert peak.source.startswith("h100-sxm bfloat16 dense 989.5 TFLOP/s")
    assert "https://www.nvidia.com/en-us/data-center/h100/" in peak.source


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA A10", "a10"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("Tesla T4", "t4"),
])
def test_a_device_is_found_by_the_name_torch_reports(name, key):
    assert lookup(name).key == key


@pytest.mark.parametrize("name", [
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a MIG slice has a fraction of the peak
    "NVIDIA H200 NVL",  # another board, lower peaks
    "NVIDIA H100 NVL",
    "NVIDIA A10G",  # AWS's A10G is not the A10
    "NVIDIA L40",  # not the L40S
    "NVIDIA GeForce RTX 4090",
])
def test_a_name_not_in_the_table_is_refused_not_guessed(name):
    with pytest.raises(UnknownDeviceError, match=rf"No dense peak FLOP/s is known for "
                                                 rf"'{name}'. Pass peak_flop_per_s="):
        lookup(name)


def test_a_dtype_without_a_peak_is_refused():
    with pytest.raises(UnknownDeviceError, match=r"no dense bfloat16 peak for "
                                                 r"'Tesla V100-SXM2-32GB'.*peak_flop_per_s="):
        gpu_peak("Tesla V100-SXM2-32GB", "bfloat16")


@pytest.mark.parametrize(("dtype", "tf32", "key"), [
    ("float32", True, "tf32"),
    ("float32", False, "float32"),
    ("bfloat16", True, "bfloat16"),
    ("float8_e4m3fn", False, "float8"),
    ("float8_e5m2", False, "float8"),
])
def test_the_table_key_of_a_contraction_dtype(dtype, tf32, key):
    assert matmul_dtype(dtype, tf32=tf32) == key


# --- the CPU estimate --------------------------------------------------------------------------

@pytest.mark.parametrize(("capability", "dtype", "flop_per_s"), [
    # threads x GHz x lanes x 2 FMA units x 2 FLOPs per FMA
    ("AVX512", "float32", 8 * 3e9 * 16 * 2 * 2),  # 1,536 GFLOP/s
    ("AVX512", "float64", 8 * 3e9 * 8 * 2 * 2),  # half the lanes
    ("AVX2", "float32", 8 * 3e9 * 8 * 2 * 2),
    ("AVX512", "bfloat16", 8 * 3e9 * 16 * 2 * 2),  # at the float32 rate: AMX not modelled
])
def test_cpu_estimate_is_threads_times_clock_times_vector_flops(capability, dtype, flop_per_s):
    peak = cpu_peak(dtype, threads=8, capability=capability, ghz=3.0, ghz_source="test")
    assert peak.flop_per_s == flop_per_s
    assert peak.source.startswith("estimate, not a datasheet figure: 8 threads x 3 GHz (test)")


@pytest.mark.parametrize(("capability", "ghz"), [("DEFAULT", 3.0), ("AVX2", None)],
                         ids=["unknown-vector-unit", "unknown-clock"])
def test_a_cpu_that_cannot_be_estimated_is_refused(capability, ghz):
    with pytest.raises(UnknownDeviceError,
                       match="Cannot estimate this CPU's peak.*peak_flop_per_s="):
        cpu_peak("float32", threads=8, capability=capability, ghz=ghz)


# --- which peak the MFU is measured against ----------------------------------------------------

class MixedPrecision(nn.Module):
    """A bfloat16 contraction of 2 FLOPs x (2 x 64 x 64) MACs = 16,384 FLOPs beside a float32
    product of 100,000: the contraction decides the dtype, however many FLOPs the rest does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)

    def forward(self, x, y):  # (2, 64) bfloat16, (100_000,) float32
        return self.fc(x), y * y


class NoContraction(nn.Module):
    def forward(self, x, y):  # float64 (4,) and float32 (16,): 4 adds against 16
        return x + x, y + y


def test_the_contraction_dtype_decides_the_peak():
    report = analyze(MixedPrecision(), (torch.ones(2, 64, dtype=torch.bfloat16),
                                        torch.ones(100_000)))
    assert report.total.flops == 2 * 2 * 64 * 64 + 100_000
    assert compute_dtype(report) == "bfloat16"


def test_without_a_contraction_the_dtype_with_most_flops_decides():
    report = analyze(NoContraction(), (torch.ones(4, dtype=torch.float64), torch.ones(16)))
    assert compute_dtype(report) == "float32"  # 16 FLOPs against 4


@pytest.mark.parametrize(("precision", "dense_tflops"), [("highest", 67), ("high", 989 / 2)],
                         ids=["float32", "tf32"])
def test_a_float32_model_on_an_h100_is_measured_against_tf32_only_when_allowed(
        monkeypatch, precision, dense_tflops):
    """H100 SXM datasheet: FP32 67 TFLOPS; TF32 989* (with sparsity), dense 494.5."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)
    report = analyze(nn.Linear(8, 8), (torch.ones(2, 8),))
    peak = mfu_peak(None, torch.device("cuda", 0), report)
    assert peak.flop_per_s == pytest.approx(dense_tflops * TERA, rel=1e-12)
    assert peak.source.startswith("h100-sxm")


def test_the_cpu_peak_is_the_estimate_for_the_threads_torch_uses(monkeypatch):
    """4 threads x 2 GHz x 16 float32 lanes (AVX512) x 2 FMA units x 2 FLOPs per FMA."""
    monkeypatch.setattr(devices, "cpu_clock_ghz", lambda: (2.0, "test clock"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    report = analyze(nn.Linear(8, 8), (torch.ones(2, 8),))
    assert mfu_peak(None, torch.device("cpu"), report).flop_per_s == 4 * 2e9 * 16 * 2 * 2


def test_a_user_peak_or_false_is_taken_as_given():
    report = analyze(nn.Linear(8, 8), (torch.ones(2, 8),))
    peak = mfu_peak(3e12, torch.device("cpu"), report)
    assert (peak.flop_per_s, peak.source, peak.estimated) == (3e12, "user", False)
    assert mfu_peak(False, torch.device("cpu"), report) is None
