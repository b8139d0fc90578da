"""``to_pandas``: the rows of ``to_csv`` as a DataFrame, the same columns, counts in base units.

The forward model is test_html.py's, counted by hand (batch B = 2, float32):

    embed   Linear(8, 16)     2*B*8*16 + B*16 (bias)  = 544 FLOPs, B*8*16  = 256 MACs
    block.0 Linear(16, 16)    2*B*16*16 + B*16        = 1056,      B*16*16 = 512
    block.1 ReLU              B*16                    = 32,        0
    block.2 Linear(16, 16)                            = 1056,      512
    head    Linear(16, 4)     2*B*16*4 + B*4          = 264,       B*16*4  = 128

so 2952 FLOPs and 1408 MACs in all.
"""

from __future__ import annotations

import csv
import io
import sys

import pytest
import sympy
import torch
from torch import nn
from torch.export import Dim

from exportflops import MissingExtraError, analyze, to_csv
from exportflops.records import Cost
from tests.records.test_repr_html import Net

pd = pytest.importorskip("pandas")

B = 2
TOTAL_FLOPS = 544 + 1056 + 32 + 1056 + 264  # 2952
TOTAL_MACS = B * 8 * 16 + 2 * B * 16 * 16 + B * 16 * 4  # 256 + 1024 + 128 = 1408
ROW_KINDS = ["modules", "operators", "nodes"]


@pytest.fixture(scope="module")
def report():
    return analyze(Net(), (torch.randn(B, 8),))


@pytest.fixture(scope="module")
def train():
    # One bias-free Linear(4, 3) on a (2, 4) input that needs no gradient: the forward mm is
    # 2*2*4*3 = 48 FLOPs, the backward only the weight's gradient, x^T @ grad: 2*4*2*3 = 48.
    return analyze(nn.Linear(4, 3, bias=False), (torch.randn(2, 4),), mode="train")


def _header(text: str) -> list[str]:
    return next(csv.reader(io.StringIO(text)))


# The column each row kind's FLOPs are summed from: a module's own ops (exclusive), so every
# node is in exactly one row, as in an op's and a node's rows.
FLOPS_COLUMN = {"modules": "exclusive_flops", "operators": "flops", "nodes": "flops"}


@pytest.mark.parametrize("rows", ROW_KINDS)
def test_each_row_kind_sums_to_the_hand_total_and_has_the_csv_columns(report, rows):
    frame = report.to_pandas(rows)
    assert list(frame.columns) == _header(to_csv(report, rows=rows))
    column = FLOPS_COLUMN[rows]
    assert frame[column].sum() == TOTAL_FLOPS == report.total.flops
    assert frame[column.replace("flops", "macs")].sum() == TOTAL_MACS == report.total.macs
    assert pd.api.types.is_integer_dtype(frame[column])  # counts are numbers, not text
    assert len(frame) == len(list(csv.reader(io.StringIO(to_csv(report, rows=rows))))) - 1


@pytest.mark.parametrize("rows", ROW_KINDS)
def test_the_csv_and_the_dataframe_hold_the_same_values(report, rows):
    frame = report.to_pandas(rows)
    from_csv = pd.read_csv(io.StringIO(to_csv(report, rows=rows)), keep_default_na=False)
    for name in frame.columns:
        assert [str(v) for v in frame[name]] == [str(v) for v in from_csv[name]], name


def test_module_rows_carry_the_path_the_depth_and_the_inclusive_counts(report):
    frame = report.to_pandas().set_index("path")
    assert frame.loc["", "inclusive_flops"] == TOTAL_FLOPS
    assert frame.loc["block", "inclusive_flops"] == 1056 + 32 + 1056
    assert frame.loc["block.0", "depth"] == 2 and frame.loc["embed", "depth"] == 1
    # embed reads x (B, 8), its weight (16, 8) and bias (16), 4 bytes each, and writes (B, 16)
    assert frame.loc["embed", "inclusive_bytes_read"] == (B * 8 + 16 * 8 + 16) * 4
    assert frame.loc["embed", "inclusive_bytes_written"] == B * 16 * 4


def test_node_rows_name_the_module_and_its_depth(report):
    frame = report.to_pandas("nodes")
    relu = frame[frame.op == "aten.relu.default"].iloc[0]
    assert (relu.module, relu.depth, relu.flops, relu.phase) == ("block.1", 2, B * 16, "forward")


@pytest.mark.parametrize("rows", ROW_KINDS)
def test_train_mode_splits_forward_and_backward(train, rows):
    frame = train.to_pandas(rows)
    assert list(frame.columns) == _header(to_csv(train, rows=rows))
    if rows == "nodes":
        backward = frame[frame.phase == "backward"].flops.sum()
        forward = frame[frame.phase == "forward"].flops.sum()
    elif rows == "modules":
        root = frame.set_index("path").loc[""]
        backward, forward = root.backward_flops, root.inclusive_flops - root.backward_flops
    else:
        backward = frame.backward_flops.sum()
        forward = frame.flops.sum() - backward
    assert (forward, backward) == (48, 48)
    assert backward == train.backward.flops


def test_forward_mode_has_no_backward_columns(report):
    assert not any(c.startswith("backward") for c in report.to_pandas("operators").columns)


def test_a_report_of_dynamic_sizes_keeps_its_expressions_until_evaluated():
    report = analyze(nn.Linear(8, 16), (torch.randn(2, 8),), dynamic_shapes=({0: Dim("batch")},))
    root = report.to_pandas().iloc[0]
    # 2*8*16 FLOPs of the matmul and 16 of the bias per row of the batch: 272 per row
    assert isinstance(root.inclusive_flops, sympy.Expr)
    assert str(root.inclusive_flops) == "272*batch"
    assert report.evaluate(batch=5).to_pandas().iloc[0].inclusive_flops == 272 * 5


def test_an_unknown_row_kind_is_refused_with_the_kinds(report):
    with pytest.raises(ValueError, match="rows must be one of 'modules', 'operators', 'nodes'"):
        report.to_pandas("layers")


def test_without_pandas_the_error_names_the_extra(report, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # an import of pandas now fails
    with pytest.raises(MissingExtraError, match=r"pip install 'exportflops\[pandas\]'"):
        report.to_pandas()


# --- generation --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generation():
    pytest.importorskip("transformers")
    from exportflops import analyze_generation
    from tests.generation.test_generation import BATCH, NEW, PROMPT, _llama

    prompt = torch.zeros(BATCH, PROMPT, dtype=torch.long, device="meta")
    return analyze_generation(_llama(), prompt, new_tokens=NEW)


def test_generation_rows_are_the_prefill_and_each_decode_step_summing_to_the_request(
        generation):
    from tests.generation.test_generation import BATCH, CONSTANT_MACS, PROMPT, attention_macs

    frame = generation.to_pandas()
    assert list(frame.columns) == _header(to_csv(generation))
    # The first new token comes out of the prefill; the other NEW - 1 = 3 out of decode steps
    # with past = PROMPT .. PROMPT + NEW - 2 = 5, 6, 7 tokens cached.
    assert list(frame.phase) == ["prefill", "decode", "decode", "decode"]
    assert list(frame.past.iloc[1:]) == [5, 6, 7]
    assert list(frame.tokens) == [BATCH * PROMPT, BATCH, BATCH, BATCH]
    # a step attends over past + 1 keys (test_generation.py derives the polynomial)
    assert list(frame.macs.iloc[1:]) == [CONSTANT_MACS + attention_macs(p + 1) for p in (5, 6, 7)]
    # Summed step by step, every count is the request's total, which the report sums in closed
    # form (power_sum) without evaluating a step.
    for field in Cost.model_fields:
        assert frame[field].sum() == getattr(generation.total, field), field


def test_generation_rows_refuse_a_report_row_kind(generation):
    with pytest.raises(ValueError, match="rows='steps'"):
        to_csv(generation, rows="modules")
