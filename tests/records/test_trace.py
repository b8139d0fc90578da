"""The Chrome/Perfetto trace of a measured report: its events nest exactly, the node events sum
to the module slices around them, and torch's own trace reader loads it and finds the same
rates; and the command writes it (and the HTML page) next to its report."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import exportflops
from exportflops import analyze
from exportflops.records.names import ancestors
from exportflops.render.trace import trace_events
from exportflops.errors import NotMeasuredError
from tests.cli_support import one_paragraph, run
from tests.records.test_html import EMBED_BYTES, EMBED_FLOPS, Net


class CalledTwice(nn.Module):
    """``fc`` runs, the root scales, ``fc`` runs again: two slices of ``fc`` around the root's
    own ``mul``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):  # (2, 4)
        return self.fc(self.fc(x) * 2)


def _profile(model, x):
    return exportflops.profile(model, (x,), warmup=1, repeat=3, peak_flop_per_s=False)


@pytest.fixture(scope="module", params=["Net", "CalledTwice"])
def measured(request):
    model = Net() if request.param == "Net" else CalledTwice()
    report = _profile(model, torch.randn(2, 8 if request.param == "Net" else 4))
    return report, trace_events(report)


def _spans(trace) -> list[dict]:
    """The complete events, with their interval in integer nanoseconds."""
    spans = []
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            spans.append({**e, "start": start, "end": start + round(e["dur"] * 1000)})
    return spans


def _inside(inner: dict, outer: dict) -> bool:
    return outer["start"] <= inner["start"] and inner["end"] <= outer["end"]


def test_one_complete_event_per_timed_node_in_graph_order(measured):
    report, trace = measured
    kernels = [e for e in _spans(trace) if e["cat"] == "kernel"]
    assert [e["name"] for e in kernels] == [t.name for t in report.runtime.nodes]


def test_any_two_events_are_nested_or_disjoint(measured):
    _, trace = measured
    spans = _spans(trace)
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            disjoint = a["end"] <= b["start"] or b["end"] <= a["start"]
            assert disjoint or _inside(a, b) or _inside(b, a), (a["name"], b["name"])


def test_node_events_sum_to_every_module_slice(measured):
    _, trace = measured
    spans = _spans(trace)
    kernels = [e for e in spans if e["cat"] == "kernel"]
    for module in (e for e in spans if e["cat"] == "module"):
        inside = [k for k in kernels if _inside(k, module)]
        assert inside, module["name"]
        assert module["end"] - module["start"] == sum(k["end"] - k["start"] for k in inside)


def test_each_node_sits_in_the_slices_of_its_module_and_every_parent(measured):
    report, trace = measured
    spans = _spans(trace)
    modules = [e for e in spans if e["cat"] == "module"]
    for kernel in (e for e in spans if e["cat"] == "kernel"):
        around = [m["args"]["module"] for m in modules if _inside(kernel, m)]
        assert around == ancestors(kernel["args"]["module"])


def test_a_module_s_slices_add_up_to_its_measured_latency(measured):
    report, trace = measured
    spans = _spans(trace)
    for timing in report.runtime.modules:
        slices = [m for m in spans if m["cat"] == "module" and m["args"]["module"] == timing.path]
        nodes = sum(1 for t in report.runtime.nodes if timing.path in ancestors(t.module))
        # each node's median is rounded to a whole nanosecond once: at most 0.5 ns off per node
        total_ns = sum(m["end"] - m["start"] for m in slices)
        assert abs(total_ns - timing.inclusive_s * 1e9) <= 0.5 * nodes + 1e-6


def test_a_module_called_twice_around_another_op_has_two_slices():
    report = _profile(CalledTwice(), torch.randn(2, 4))
    slices = [e for e in trace_events(report)["traceEvents"] if e.get("cat") == "module"]
    assert [e["args"]["module"] for e in slices] == ["", "fc", "fc"]


def test_counts_are_in_the_args_under_torch_s_names_too():
    report = _profile(Net(), torch.randn(2, 8))
    (embed,) = [e for e in trace_events(report)["traceEvents"]
                if e.get("cat") == "kernel" and e["args"]["module"] == "embed"]
    assert embed["args"]["flops"] == embed["args"]["kernel_flop"] == EMBED_FLOPS
    assert embed["args"]["bytes_read"] + embed["args"]["bytes_written"] == EMBED_BYTES
    assert embed["args"]["kernel_num_gb"] == EMBED_BYTES / 1e9  # torch's GB: 1e9 bytes


def test_torch_s_trace_reader_loads_it_and_finds_the_achieved_rates(tmp_path):
    profile_analysis = pytest.importorskip("torch._inductor.analysis.profile_analysis")
    report = _profile(Net(), torch.randn(2, 8))
    path = tmp_path / "trace.json"
    path.write_text(exportflops.to_trace(report))
    reader = profile_analysis.JsonProfile(str(path), dtype="float32")
    reader.augment_trace()
    table = reader.report(name_limit=80)
    # Its rows: kernel name | count | FLOPS (kernel_flop / dur) | GB/s | dur (us) | ...
    rows = {cells[0]: cells for cells in
            ([c.strip() for c in line.split("|")] for line in table.splitlines())
            if len(cells) > 3}
    for timing in report.runtime.nodes:
        assert float(rows[timing.name][2]) == pytest.approx(timing.achieved_flop_per_s, rel=1e-4)


def test_a_report_that_was_not_measured_has_no_trace(tmp_path):
    report = analyze(Net(), (torch.randn(2, 8),))
    with pytest.raises(NotMeasuredError, match="exportflops.profile"):
        exportflops.to_trace(report)


def test_the_command_writes_the_trace_and_the_page(models, tmp_path):
    pytest.importorskip("plotly")
    trace, page = tmp_path / "trace.json", tmp_path / "report.html"
    result = run("cli_models:mlp", "--device", "cpu", "--profile", "--warmup", "1", "--repeat",
                 "2", "--trace", str(trace), "--format", "html", "--output", str(page),
                 cwd=models)
    assert result.returncode == 0, result.stderr
    # mlp: Linear(4, 8), ReLU, Linear(8, 2): three timed nodes
    kernels = [e for e in json.loads(trace.read_text())["traceEvents"]
               if e.get("cat") == "kernel"]
    assert [e["args"]["op"] for e in kernels] == ["aten.linear.default", "aten.relu.default",
                                                  "aten.linear.default"]
    assert page.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("args, says", [
    (["--trace", "t.json"], "--profile"),
    (["--format", "html"], "--output"),
], ids=["trace-without-profile", "html-without-output"])
def test_the_command_refuses_what_it_cannot_write(models, args, says):
    result = run("cli_models:mlp", *args, cwd=models)
    assert result.returncode == 2 and says in result.stderr and one_paragraph(result.stderr)
