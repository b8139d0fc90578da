"""The plain-loop helper: MFU as FLOPs / seconds / dense peak, the peak read from the datasheet
row (dense, never the sparse figure), an unknown device refused, and a timer that waits for CUDA.

Each expected peak is the datasheet's printed figure, halved where it is printed with 2:4
sparsity (the H100's), as written out in each test."""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from exportflops.errors import UnknownDeviceError
from exportflops.training.throughput import StepTimer, Throughput, dense_peak, throughput_of


def test_h100_sxm_bfloat16_mfu_is_taken_against_half_the_printed_sparse_peak():
    # H100 SXM datasheet (https://www.nvidia.com/en-us/data-center/h100/): bf16 "1,979
    # teraFLOPS*", * with sparsity: dense 1979 / 2 = 989.5 TFLOP/s.
    # 3.958e15 FLOPs in 10 s: 3.958e14 FLOP/s, and 3.958e14 / 9.895e14 = 0.4.
    rate = throughput_of(3_958 * 10**12, 10.0, device="h100-sxm", dtype="bfloat16")
    assert rate.peak_flop_per_s == 989.5e12
    assert rate.achieved_flop_per_s == pytest.approx(3.958e14, rel=1e-12)
    assert rate.mfu == pytest.approx(0.4, rel=1e-12)
    assert (rate.device, rate.dtype) == ("h100-sxm", "bfloat16")
    assert "h100" in rate.peak_source and "datasheet" in rate.peak_source


def test_a100_bfloat16_mfu_uses_the_printed_dense_figure():
    # A100 datasheet: bf16 "312 TF | 624 TF*": the dense figure is printed, 312 TFLOP/s.
    # 312e12 FLOPs in 2 s: 156e12 FLOP/s, half the peak.
    rate = throughput_of(312 * 10**12, 2.0, device="a100-sxm-80gb", dtype=torch.bfloat16)
    assert rate.peak_flop_per_s == 312e12
    assert rate.mfu == pytest.approx(0.5, rel=1e-12)


def test_a_peak_given_is_used_as_is():
    # 5e11 FLOPs in 0.25 s: 2e12 FLOP/s over a 4e12 peak.
    rate = throughput_of(5 * 10**11, 0.25, peak_flop_per_s=4e12)
    assert (rate.achieved_flop_per_s, rate.mfu) == (2e12, 0.5)
    assert (rate.device, rate.peak_source) == ("user", "user")


def test_no_peak_asked_for_gives_the_rate_without_mfu():
    rate = throughput_of(600, 3.0, peak_flop_per_s=False)
    assert (rate.achieved_flop_per_s, rate.peak_flop_per_s, rate.mfu) == (200.0, None, None)


def test_float32_reads_the_float32_peak_unless_tf32_is_allowed(monkeypatch):
    # H100 SXM: FP32 67 TFLOP/s; TF32 "989 teraFLOPS*" with sparsity, 494.5 dense.
    assert dense_peak(device="h100-sxm", dtype=torch.float32).flop_per_s == 67e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    tf32 = dense_peak(device="h100-sxm", dtype=torch.float32)
    assert (tf32.dtype, tf32.flop_per_s) == ("tf32", 494.5e12)


def test_a_cuda_device_the_table_knows_is_read_by_its_whole_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA H100 80GB HBM3")
    peak = dense_peak(dtype="bfloat16")
    assert (peak.device, peak.flop_per_s) == ("h100-sxm", 989.5e12)


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A10G",
                                  "NVIDIA B200"], ids=["mig-slice", "a10g", "new-gpu"])
def test_a_cuda_device_the_table_lacks_is_an_error_naming_both_ways_to_give_the_peak(
        monkeypatch, name):
    """Never an A100 fallback: the MIG slice's name holds "A100" and still matches no row."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: name)
    with pytest.raises(UnknownDeviceError, match=r"peak_flop_per_s=.*device='h100-sxm'"):
        throughput_of(1, 1.0)


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")],
                         ids=["no-cuda", "cpu-string", "cpu-device"])
def test_on_cpu_the_peak_is_the_estimate_and_says_so(known_cpu, device):
    # 1e9 FLOPs in 1 s over the fixture's 256e9 FLOP/s: 1 / 256.
    rate = throughput_of(10**9, 1.0, device=device)
    assert (rate.peak_flop_per_s, rate.mfu, rate.device) == (known_cpu, 1 / 256, "cpu")
    assert rate.peak_source.startswith("estimate, not a datasheet figure")
    assert dense_peak(device=device).estimated


def test_profile_and_the_trainers_take_the_same_cpu_peak(known_cpu):
    """One rule: profile()'s peak (`devices.mfu_peak`) for a float32 report on the CPU is the
    trainers' (`dense_peak`) in float32."""
    from exportflops import analyze
    from exportflops.roofline.devices import mfu_peak

    report = analyze(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    profiled = mfu_peak(None, torch.device("cpu"), report)
    assert profiled.flop_per_s == dense_peak(dtype="float32").flop_per_s == known_cpu
    assert profiled.estimated


def test_a_device_that_is_neither_cuda_nor_the_cpu_has_no_peak_to_guess():
    for where in ("mps", "xpu"):
        with pytest.raises(UnknownDeviceError, match=rf"a {where} device.*peak_flop_per_s="):
            dense_peak(device=where)


def test_a_dtype_the_device_has_no_peak_for_is_an_error():
    # V100: no bfloat16 tensor cores, so the table has no bfloat16 peak for it.
    with pytest.raises(UnknownDeviceError, match=r"no dense bfloat16 peak for v100-sxm2"):
        dense_peak(device="v100-sxm2", dtype="bfloat16")


def test_an_unknown_table_key_is_an_error_listing_the_keys():
    with pytest.raises(UnknownDeviceError, match=r"h100-sxm"):
        dense_peak(device="h100")


@pytest.mark.parametrize("arguments, error", [
    ({"peak_flop_per_s": 1e12, "device": "h100-sxm"}, TypeError),
    ({"peak_flop_per_s": -1.0}, ValueError),
    ({"peak_flop_per_s": True}, ValueError),
    ({"peak_flop_per_s": 1e12, "dtype": "int4"}, ValueError),
], ids=["peak-and-device", "negative-peak", "true-peak", "unknown-dtype"])
def test_arguments_that_name_no_single_peak_are_refused(arguments, error):
    with pytest.raises(error):
        dense_peak(**arguments)


@pytest.mark.parametrize("flops, seconds", [(1.5, 1.0), (True, 1.0), (-1, 1.0), (1, 0.0),
                                            (1, float("nan"))],
                         ids=["float-flops", "bool-flops", "negative-flops", "zero-seconds",
                              "nan-seconds"])
def test_a_count_that_is_not_a_count_or_a_time_that_is_not_a_time_is_refused(flops, seconds):
    with pytest.raises(ValueError):
        throughput_of(flops, seconds, peak_flop_per_s=1e12)


def test_the_record_round_trips_through_json_and_documents_every_field():
    rate = throughput_of(3_958 * 10**12, 10.0, device="h100-sxm")
    assert Throughput.model_validate_json(rate.model_dump_json()) == rate
    assert [name for name, field in Throughput.model_fields.items()
            if not field.description] == []


def test_the_timer_covers_the_block():
    timer = StepTimer()
    with timer:
        time.sleep(0.02)
    assert timer.seconds >= 0.02


def test_the_timer_synchronizes_cuda_at_both_ends_once_cuda_is_in_use(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *device: calls.append("sync"))
    with StepTimer():
        calls.append("work")
    assert calls == ["sync", "work", "sync"]


def test_the_timer_leaves_cuda_alone_when_this_process_has_not_used_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *device: pytest.fail("synchronized"))
    with StepTimer() as timer:
        pass
    assert timer.seconds >= 0


def test_the_timer_is_the_difference_of_two_perf_counter_reads(monkeypatch):
    ticks = iter([10.0, 10.75])
    # The module itself, whatever the package's namespace binds to its name.
    module = importlib.import_module("exportflops.training.throughput")
    monkeypatch.setattr(module, "perf_counter", lambda: next(ticks))
    with StepTimer() as timer:
        pass
    assert timer.seconds == 0.75
