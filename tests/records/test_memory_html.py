"""The memory report's HTML page, opened in a real headless Chromium (skipped where there is
none, as in test_html.py), and its timeline figure read as data.

The model is small enough to derive by hand: Linear(8, 16), ReLU, Linear(16, 4) on a (2, 8)
float32 input (tests/footprint/test_memory.py derives its forward's peak the same way).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import exportflops
from exportflops.errors import InputError
from exportflops.render.memory_html import memory_timeline
from tests.browser import Browser, find_chromium

pytest.importorskip("plotly", reason="the HTML report needs the html extra (plotly)")

FP32 = 4
PARAMS = (8 * 16 + 16 + 16 * 4 + 4) * FP32
# At the ReLU: the parameters, the input (2x8), the first Linear's output (2x16), the ReLU's.
FORWARD_PEAK = PARAMS + (2 * 8 + 2 * 16 + 2 * 16) * FP32
KINDS = 7  # parameters, buffers, gradients, optimizer, activations, temporaries, inputs
MODULES = 4  # the root and its three children
CHROMIUM = find_chromium()


def _mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), (torch.randn(2, 8),)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The forward's page with the t4 fit, opened once in Chromium: what the tests read."""
    if CHROMIUM is None:
        pytest.skip("no chromium (apt-get install chromium; .ci/run does)")
    report = exportflops.memory(*_mlp(), mode="forward")
    path = tmp_path_factory.mktemp("html") / "memory.html"
    path.write_text(exportflops.to_html(report, device="t4"))
    rows = "document.querySelectorAll({!r}).length".format
    with Browser(CHROMIUM) as browser:
        browser.open(path.as_uri())
        seen = SimpleNamespace(
            traces=browser.evaluate("document.getElementById('memory-timeline').data.map("
                                    "t => [t.name, t.y])"),
            areas=browser.evaluate(rows("#memory-timeline .scatterlayer .trace")),
            kind_rows=browser.evaluate(rows("#kinds tbody tr")),
            module_rows=browser.evaluate(rows("#memory-modules tbody tr")),
            summary=browser.evaluate("document.getElementById('summary').textContent"))
        seen.requests = browser.requested_urls()
    return seen


def test_the_timeline_stacks_one_area_per_kind_up_to_the_hand_peak(page):
    assert page.areas == KINDS
    totals = [sum(point) for point in zip(*(y for _, y in page.traces))]
    assert max(totals) == FORWARD_PEAK
    parameters = dict(page.traces)["parameters"]
    assert set(parameters) == {PARAMS}  # held through the whole step


def test_the_tables_list_each_kind_and_each_module_and_the_summary_the_fit(page):
    assert (page.kind_rows, page.module_rows) == (KINDS, MODULES)
    shown = f"{FORWARD_PEAK / 1000:.2f} kB"  # 1168 B, written as the tables write counts
    assert f"peak {shown} in the forward at aten.relu.default #2" in page.summary
    assert f"Fits t4: peak {shown}" in page.summary


def test_no_request_leaves_the_memory_page(page):
    assert [url for url in page.requests if not url.startswith("file://")] == []


def test_a_training_steps_timeline_saws_up_through_the_forward_and_down_the_backward():
    report = exportflops.memory(*_mlp())
    figure = memory_timeline(report)
    activations = next(trace.y for trace in figure.data if trace.name == "activations")
    phases = [point.phase for point in report.timeline]
    last_forward = len(phases) - 1 - phases[::-1].index("forward")
    backward = [a for a, phase in zip(activations, phases) if phase == "backward"]
    # Activations pile up to the forward's end; the backward frees each once its node ran.
    assert max(activations) == activations[last_forward] > 0
    assert backward[-1] == 0 and all(b <= a for a, b in zip(backward, backward[1:]))
    assert len(figure.layout.shapes) == 2  # the backward and the optimizer phases shaded


def test_the_memory_page_takes_no_roofline():
    with pytest.raises(InputError, match="to_html\\(\\) of the memory of Sequential takes no "
                                         "roofline"):
        exportflops.to_html(exportflops.memory(*_mlp(), mode="forward"), roofline=object())
