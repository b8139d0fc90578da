"""The dense peak table against the figures REFERENCES.md cites (shared/REFERENCES.md, "Peak
FLOPS: a trap": H100/H200 SXM bf16 is printed 1979 TFLOPS with 2:4 sparsity, dense 989; A100
bf16 dense is 312 TFLOPS) and the CPU estimate's arithmetic."""

from __future__ import annotations

import pytest

from exportflops.devices import DEVICES, UnknownDeviceError, cpu_peak, gpu_peak, lookup

TERA = 1e12


@pytest.mark.parametrize(("name", "dense_bf16_tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.5),  # 1979 with sparsity / 2
    ("NVIDIA H200", 989.5),
    ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100-PCIE-40GB", 312),
])
def test_bf16_peaks_are_the_dense_figures(name, dense_bf16_tflops):
    assert gpu_peak(name, "bfloat16").flop_per_s == dense_bf16_tflops * TERA


def test_every_row_cites_its_datasheet():
    assert all(device.source.startswith("NVIDIA") and "https://" in device.source
               for device in DEVICES)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H200 NVL",
                                  "NVIDIA GeForce RTX 4090"])
def test_a_name_not_in_the_table_is_refused_not_guessed(name):
    with pytest.raises(UnknownDeviceError, match="peak_flops="):
        lookup(name)


def test_a_dtype_without_a_peak_is_refused():
    with pytest.raises(UnknownDeviceError, match="no dense bfloat16 peak"):
        gpu_peak("Tesla V100-SXM2-32GB", "bfloat16")


def test_cpu_estimate_is_threads_times_clock_times_vector_flops():
    """8 threads x 3 GHz x (16 fp32 lanes x 2 FMA units x 2 FLOPs) = 1,536 GFLOP/s."""
    peak = cpu_peak("float32", threads=8, capability="AVX512", ghz=3.0, ghz_source="test")
    assert peak.flop_per_s == 8 * 3e9 * 64
    assert peak.source.startswith("estimate, not a datasheet figure")
