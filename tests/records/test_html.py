"""The HTML report: opened in a real headless Chromium (Debian's ``chromium``; the browser tests
skip where there is none, and .ci/run installs it), and its figures read as data.

The model is small enough to count by hand (batch B = 2, float32):

    embed   Linear(8, 16)     2*B*8*16 + B*16 (bias)  = 544 FLOPs
    block.0 Linear(16, 16)    2*B*16*16 + B*16        = 1056
    block.1 ReLU              B*16                    = 32
    block.2 Linear(16, 16)                            = 1056
    head    Linear(16, 4)     2*B*16*4 + B*4          = 264

so 7 modules (the root, embed, block, its 3 children, head), all with FLOPs, and 5 counted
nodes.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import exportflops
from exportflops import MissingExtraError, analyze
from exportflops.roofline.predict import device_roofs
from exportflops.render.html import CONTENT_SECURITY_POLICY, html_report
from exportflops.render.plots import roofline_scatter
from exportflops.errors import UnknownDeviceError
from tests.browser import Browser, find_chromium

pytest.importorskip("plotly", reason="the HTML report needs the html extra (plotly)")

B = 2
MODULES = 7  # root, embed, block, block.0, block.1, block.2, head
COUNTED_NODES = 5  # four linears and a relu
EMBED_FLOPS = 2 * B * 8 * 16 + B * 16  # 512 MACs x 2 + one bias add per output = 544
# x (B, 8) + weight (16, 8) + bias (16) read, (B, 16) written, 4 bytes each
EMBED_BYTES = (B * 8 + 16 * 8 + 16) * 4 + B * 16 * 4  # 640 + 128 = 768

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install "
                                                            "chromium; .ci/run does)")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):  # (B, 8) -> (B, 4)
        return self.head(self.block(self.embed(x)))


@pytest.fixture(scope="module")
def profiled():
    return exportflops.profile(Net(), (torch.randn(B, 8),), warmup=1, repeat=3,
                               peak_flop_per_s=1e12)


@pytest.fixture(scope="module")
def counted():
    return analyze(Net(), (torch.randn(B, 8),))


@pytest.fixture(scope="module")
def page(profiled, tmp_path_factory):
    """The profiled report's page, opened once in Chromium: what the tests read of it."""
    if CHROMIUM is None:
        pytest.skip("no chromium")
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(exportflops.to_html(profiled))
    count = "document.querySelectorAll({!r}).length".format
    with Browser(CHROMIUM) as browser:
        browser.open(path.as_uri())
        seen = SimpleNamespace(
            url=path.as_uri(),
            flops_boxes=browser.evaluate(count("#icicle-flops g.slice")),
            time_boxes=browser.evaluate(count("#icicle-time g.slice")),
            points=browser.evaluate(count("#roofline .scatterlayer path.point")),
            box_labels=browser.evaluate("Array.from(document.querySelectorAll("
                                        "'#icicle-flops g.slice text')).map(t => t.textContent)"),
            policy=browser.evaluate("document.querySelector('meta[http-equiv="
                                    "\"Content-Security-Policy\"]').content"),
            module_rows=[],
        )
        column = ("Array.from(document.querySelectorAll('#modules tbody tr'))"
                  ".map(r => [r.cells[0].textContent, parseFloat(r.cells[4].dataset.v)])")
        flops_heading = "#modules th:nth-child(5)"
        for _ in range(2):  # the first click sorts by FLOPs descending, the second ascending
            browser.evaluate(f"document.querySelector({flops_heading!r}).click()")
            seen.module_rows.append(browser.evaluate(column))
        seen.requests = browser.requested_urls()
        seen.messages = browser.messages()
    return seen


@needs_chromium
def test_the_page_draws_one_box_per_module_by_flops_and_by_time(page):
    assert page.flops_boxes == MODULES
    assert page.time_boxes == MODULES
    assert sorted(page.box_labels) == sorted(["Net", "embed", "block", "0", "1", "2", "head"])


@needs_chromium
def test_the_page_plots_one_point_per_counted_node(page):
    assert page.points == COUNTED_NODES


@needs_chromium
def test_the_module_table_sorts_by_flops_on_a_click(page):
    descending, ascending = page.module_rows
    # The root holds every FLOP (544 + 1056 + 32 + 1056 + 264 = 2952); the ReLU the fewest.
    assert descending[0] == ["(root)", 2952] and descending[-1] == ["block.1", B * 16]
    assert [f for _, f in descending] == sorted((f for _, f in descending), reverse=True)
    assert [f for _, f in ascending] == sorted(f for _, f in descending)


@needs_chromium
def test_no_request_leaves_the_page_and_the_policy_forbids_any(page):
    # the file itself and data: URLs (an image written inline, as plotly's webp probe) only
    assert [u for u in page.requests if u != page.url and not u.startswith("data:")] == []
    assert page.url in page.requests  # the log did record the page's own request
    assert page.policy == CONTENT_SECURITY_POLICY and "default-src 'none'" in page.policy
    assert page.messages == []  # no CSP violation, no script error


@needs_chromium
def test_the_browser_check_sees_what_the_policy_blocks(tmp_path):
    """The checks above can fail: a page under the same policy that asks for a remote image is
    seen asking."""
    control = tmp_path / "control.html"
    control.write_text(f"<html><head><meta http-equiv='Content-Security-Policy' "
                       f"content=\"{CONTENT_SECURITY_POLICY}\"></head><body>"
                       f"<img src='https://example.invalid/x.png'></body></html>")
    with Browser(CHROMIUM) as browser:
        browser.open(control.as_uri())
        messages = browser.messages()
    assert any("Content Security Policy" in m and "example.invalid" in m for m in messages)


def _markers(figure) -> list:
    return [t for t in figure.data if t.mode == "markers"]


def test_a_counted_report_plots_flops_against_intensity(counted):
    figure = roofline_scatter(counted)
    points = {n: (x, y) for t in _markers(figure)
              for n, x, y in zip((c[0] for c in t.customdata), t.x, t.y)}
    assert len(points) == COUNTED_NODES
    embed = next(n.name for n in counted.nodes if n.module == "embed")
    assert points[embed] == pytest.approx((EMBED_FLOPS / EMBED_BYTES, EMBED_FLOPS))
    assert "FLOPs" in figure.layout.yaxis.title.text


def test_a_measured_report_plots_achieved_rates_under_its_peak(profiled):
    figure = roofline_scatter(profiled, peaks={"peak": 1e12})
    rates = {t.name: t.achieved_flop_per_s for t in profiled.runtime.nodes}
    for trace in _markers(figure):
        for name, y in zip((c[0] for c in trace.customdata), trace.y):
            assert y == rates[name]
    (roof,) = [t for t in figure.data if t.mode == "lines"]
    assert set(roof.y) == {1e12}


def test_roofs_meet_at_the_ridge_point(profiled):
    # 100 TFLOP/s over 2 TB/s: the ridge is at 100e12 / 2e12 = 50 FLOPs per byte.
    figure = roofline_scatter(profiled, peaks={"peak": 100e12}, bandwidth_byte_per_s=2e12)
    compute, memory = [t for t in figure.data if t.mode == "lines"]
    assert compute.x[0] == pytest.approx(50) and set(compute.y) == {100e12}
    assert memory.x[-1] == pytest.approx(50) and memory.y[-1] == pytest.approx(100e12)
    assert memory.y[0] == pytest.approx(2e12 * memory.x[0])  # bandwidth x intensity


def test_a_roofline_adds_each_node_s_predicted_rate_and_its_bound(counted):
    # What exportflops.roofline.roofline(report, device) returns, reduced to the fields the
    # picture reads.
    nodes = [SimpleNamespace(name=n.name, intensity=1.0 + i, predicted_s=1e-6,
                             bound="memory" if n.op == "aten.relu.default" else "compute")
             for i, n in enumerate(counted.nodes) if n.status == "counted"]
    figure = roofline_scatter(counted, roofline=SimpleNamespace(nodes=nodes))
    by_name = {c[0]: (x, y, t.name) for t in _markers(figure)
               for c, x, y in zip(t.customdata, t.x, t.y)}
    embed = next(n for n in nodes if n.name.startswith("linear"))
    # FLOPs / predicted time: 544 / 1e-6 s
    assert by_name[embed.name] == (embed.intensity, pytest.approx(EMBED_FLOPS / 1e-6),
                                   "predicted, compute-bound")
    assert sum(1 for _, _, label in by_name.values() if label.endswith("memory-bound")) == 1
    page = html_report(counted, roofline=SimpleNamespace(nodes=nodes))
    assert "<th>predicted time</th><th>bound</th>" in page


def test_a_device_key_draws_the_table_s_dense_peak(profiled, tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    # H100 SXM datasheet: FP32 67 teraFLOPS (float32 without TF32 at precision "highest"),
    # GPU memory bandwidth 3.35 TB/s.
    assert device_roofs("h100-sxm", profiled) == ({"h100-sxm float32 dense 67 TFLOP/s": 67e12},
                                                  3.35e12)
    path = tmp_path / "h100.html"
    path.write_text(exportflops.to_html(profiled, device="h100-sxm"))
    assert "roof: h100-sxm float32 dense 67 TFLOP" in path.read_text()


def test_an_unknown_device_key_names_the_known_ones(counted, tmp_path):
    with pytest.raises(UnknownDeviceError, match="h100-sxm"):
        exportflops.to_html(counted, device="h100")


def test_without_plotly_the_error_names_the_extra_to_install(counted, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)  # import raises
    with pytest.raises(MissingExtraError, match=r"pip install 'exportflops\[html\]'"):
        html_report(counted)


def test_the_icicle_writes_each_modules_flops_as_the_tables_do():
    pytest.importorskip("plotly")
    from exportflops.render.plots import module_icicle

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 64), nn.Linear(64, 64))
    report = analyze(model, (torch.randn(8, 4),))
    (trace,) = module_icicle(report).data
    shown = {c[0]: c[2] for c in trace.customdata}
    # 8 rows: 2 x 8 x 4 x 3 + 8 x 3 (bias) = 216; 2 x 8 x 64 x 64 + 8 x 64 = 66,048.
    assert shown["0"] == "216 FLOPs"
    assert shown["2"] == "66.05 kFLOPs"


def test_the_scatter_writes_each_nodes_flops_and_bytes_as_the_tables_do():
    pytest.importorskip("plotly")
    report = analyze(nn.Linear(4, 3, bias=False), (torch.randn(8, 4),))
    (trace,) = [t for t in roofline_scatter(report).data if t.customdata is not None]
    (point,) = trace.customdata
    # 2 x 8 x 4 x 3 = 192 FLOPs; float32 bytes: input 8 x 4, weight 3 x 4, output 8 x 3,
    # (32 + 12 + 24) x 4 = 272.
    assert (point[3], point[4]) == ("192 FLOPs", "272 B")
