"""`MemoryReport.fits` against the device table's memory, by hand."""

from __future__ import annotations

import re

import pytest
import torch

import exportflops
from exportflops.errors import UnknownDeviceError
from exportflops.records import DeviceFit, MemoryOnDevice
from tests.footprint.models import FP32


def _meta_linear_forward(rows: int, columns: int) -> exportflops.MemoryReport:
    with torch.device("meta"):
        model = torch.nn.Linear(columns, rows)
        x = torch.empty(1, columns)
    return exportflops.memory(model, (x,), mode="forward")


def test_a_step_under_the_capacity_fits_with_the_datasheets_gb_less_its_peak():
    report = _meta_linear_forward(5, 3)
    # weight 5x3, bias 5, input 1x3, output 1x5, float32; the H100 SXM datasheet's "80GB"
    # read as 10^9 bytes
    peak = (15 + 5 + 3 + 5) * FP32
    fit = report.fits("h100-sxm")
    assert (fit.fits, fit.capacity_bytes, fit.peak_bytes, fit.headroom_bytes) == \
        (True, 80 * 10**9, peak, 80 * 10**9 - peak)
    assert "https://www.nvidia.com/en-us/data-center/h100/" in fit.source


def test_a_step_over_the_capacity_does_not_fit_and_its_headroom_is_negative():
    # A 100,000 x 50,000 float32 weight is 20 GB; the T4 datasheet prints "16 GB GDDR6".
    report = _meta_linear_forward(100_000, 50_000)
    peak = (100_000 * 50_000 + 100_000 + 50_000 + 100_000) * FP32
    fit = report.fits("t4")
    assert (fit.fits, fit.headroom_bytes) == (False, 16 * 10**9 - peak)
    assert report.fits("a100-sxm-40gb").fits is True  # "40GB HBM2": 40e9 > 20.001e9


def test_an_unknown_device_names_the_tables_keys():
    report = _meta_linear_forward(5, 3)
    with pytest.raises(UnknownDeviceError, match=re.escape("No device 'h300' in the table; "
                                                           "its keys are a100-sxm-40gb")):
        report.fits("h300")


def test_a_row_of_boards_with_different_memory_is_refused_naming_total_memory():
    with pytest.raises(UnknownDeviceError, match="v100-sxm2 row covers boards with different "
                                                 "memory.*total_memory"):
        _meta_linear_forward(5, 3).fits("v100-sxm2")


def test_the_fit_and_the_report_with_it_round_trip_through_json():
    report = _meta_linear_forward(5, 3)
    fit = report.fits("l4")
    assert DeviceFit.model_validate_json(fit.model_dump_json()) == fit
    both = MemoryOnDevice(memory=report, fit=fit)
    assert MemoryOnDevice.model_validate_json(both.model_dump_json()) == both
