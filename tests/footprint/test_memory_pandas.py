"""`MemoryReport.to_pandas`: the timeline and the modules as frames whose numbers are the
report's, checked against a hand-derived forward."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.records.memory import KindBytes
from tests.footprint.models import FP32

pandas = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def report():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return exportflops.memory(model, (torch.randn(2, 8),), mode="forward")


def test_the_timeline_frame_has_one_row_per_op_and_its_peak_row_is_the_hand_peak(report):
    frame = report.to_pandas()
    assert list(frame.columns) == ["index", "op", "module", "phase", *KindBytes.model_fields,
                                   "total"]
    assert len(frame) == len(report.timeline)
    # The kinds of each row add up to its total.
    assert (frame[list(KindBytes.model_fields)].sum(axis=1) == frame["total"]).all()
    # At the ReLU: parameters, the input (2x8), the first Linear's output (2x16) and its own
    # (2x16), as test_memory.py derives it.
    peak = frame.loc[frame["total"].idxmax()]
    params = (8 * 16 + 16 + 16 * 4 + 4) * FP32
    assert (peak["op"], peak["module"], peak["total"]) == \
        ("aten.relu.default", "1", params + (2 * 8 + 2 * 16 + 2 * 16) * FP32)


def test_the_modules_frame_has_one_row_per_module_in_order(report):
    frame = report.to_pandas("modules")
    assert list(frame["path"]) == ["", "0", "1", "2"]
    assert list(frame["type"])[1] == "torch.nn.modules.linear.Linear"


def test_an_unknown_row_kind_names_the_kinds(report):
    with pytest.raises(ValueError, match="rows must be one of 'timeline', 'modules'"):
        report.to_pandas("nodes")
