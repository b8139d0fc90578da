"""`outputs.to_format`: the command's formats of the values its analyses return, from
Python. TwoLayerMLP(32, 64, 10) on (4, 32), as tests/records/test_render.py derives it: MACs
4*32*64 + 4*64*10 = 10,752; FLOPs 16,640 (fc1) + 256 (relu) + 5,160 (fc2) = 22,056."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from exportflops import Report, analyze
from exportflops.errors import InputError
from exportflops.render import MARKDOWN, RenderOptions, Style
from exportflops.outputs import FORMATS, Results, to_format
from exportflops.roofline import roofline
from tests.models import TwoLayerMLP

MACS, FLOPS = 4 * 32 * 64 + 4 * 64 * 10, 16_640 + 256 + 5_160


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze(TwoLayerMLP(), (torch.randn(4, 32),))


def test_json_holds_the_report_alone_or_beside_its_roofline(report):
    alone = Report.model_validate_json(to_format(Results(report), "json"))
    assert (alone.total.macs, alone.total.flops) == (MACS, FLOPS)
    both = json.loads(to_format(Results(report, roofline=roofline(report, "h100-sxm")), "json"))
    assert set(both) == {"report", "roofline"}
    assert (both["report"]["total"]["flops"], both["roofline"]["device"]) == (FLOPS, "h100-sxm")


def test_json_keeps_the_roofline_and_the_comparison_when_both_are_beside_the_report(report):
    # A record stands in for the --budget comparison: the JSON keeps what it is given.
    results = Results(report, roofline=roofline(report, "h100-sxm"), comparison=report.total)
    written = json.loads(to_format(results, "json"))
    assert set(written) == {"report", "roofline", "comparison"}
    assert written["comparison"]["flops"] == FLOPS


@pytest.mark.parametrize(("view", "first_column"), [(("operators",), "op"),
                                                   (("tree",), "path")],
                         ids=["operators", "modules"])
def test_csv_writes_one_row_per_op_or_per_module_summing_to_the_total(report, view,
                                                                      first_column):
    text = to_format(Results(report), "csv", RenderOptions(view=view))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert next(iter(rows[0])) == first_column
    flops = "flops" if view == ("operators",) else "exclusive_flops"
    assert sum(int(row[flops]) for row in rows) == FLOPS


def test_a_roofline_is_printed_under_the_report(report):
    text = to_format(Results(report, roofline=roofline(report, "h100-sxm")), "table",
                     RenderOptions(view=("summary",)))
    summary, _, rest = text.partition("\n\n")
    assert "h100-sxm" not in summary and "h100-sxm" in rest


def test_a_records_own_view_gets_the_markdown_style_for_md_and_plain_text_otherwise():
    styles: list[Style] = []

    def view(record, style):
        styles.append(style)
        return f"{record}\n"

    for format in ("table", "md"):
        assert to_format(Results(record="the record", view=view), format) == "the record\n"
    assert styles == [Style(), MARKDOWN]


def test_an_unknown_format_is_refused_with_the_formats(report):
    with pytest.raises(InputError, match=f"format='xml'.*{', '.join(FORMATS)}"):
        to_format(Results(report), "xml")


def test_a_record_without_a_view_is_refused_naming_the_records_that_have_one():
    with pytest.raises(InputError, match=r"holds a str, which has no view: pass "
                                         r"Results\(view=...\).*MemoryReport, .*FitPlan"):
        to_format(Results(record="the record"), "table")


def test_a_memory_record_is_drawn_by_its_view_with_the_options_depth():
    """RECORD_VIEWS picks the view by the record's type: TwoLayerMLP's module tree is the
    root and its fc1, act and fc2, one level down, so depth 0 leaves those three rows out."""
    from exportflops import memory

    step = memory(TwoLayerMLP(), (torch.randn(4, 32),))
    deep, shallow = ([line.split()[0] for line in to_format(
        Results(record=step), "table", RenderOptions(depth=depth)).splitlines()
        if line.startswith("  ")] for depth in (-1, 0))
    assert (deep, shallow) == (["fc1", "act", "fc2"], [])
