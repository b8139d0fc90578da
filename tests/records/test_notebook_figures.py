"""What a notebook cell shows for a record (``_ipython_display_``, render/notebook_figures.py),
captured from IPython's display: the record's HTML first, then each of its plotly pictures as
plotly's own MIME bundle (data, no plotly.js, no request); without plotly the HTML alone.

The numbers, by hand:

- `Sequential(Linear(4, 3), ReLU())` on a (2, 4) float32 input: the linear does
  2 x 4 x 3 = 24 MACs, 2 x 24 + 2 x 3 (bias) = 54 FLOPs; the ReLU 1 FLOP per output element,
  2 x 3 = 6; 60 in all. The icicle gives each box its own FLOPs (plotly adds the children's): the
  root 0, ``0`` 54, ``1`` 6. Wrapped once more, `Sequential(Sequential(...))`, the tree has 4
  modules at depths 0, 1, 2, 2; an icicle of at most 2 boxes stops at depth 1, where ``0`` holds
  its children's 54 + 6 = 60.
- A bias-free Linear(4096, 4096) on 512 float32 rows under an H100 SXM's roofline (NVIDIA's
  datasheet: 67 TFLOP/s float32, 3.35 TB/s; tests/records/test_repr_html.py): 2 x 512 x 4096 x
  4096 = 17179869184 FLOPs over x 8 MiB + W 64 MiB read and 8 MiB written = 83886080 bytes, an
  intensity of 204.8 FLOP/B, above the ridge 67e12 / 3.35e12 = 20 FLOP/B: compute-bound, so its
  predicted rate is the float32 peak, 67e12 FLOP/s; the text view writes its time 17179869184 /
  67e12 = 256.42 us.
- Context parallelism (tests/records/test_parallel_pictures.py): causal attention on 16
  positions, cp = 2 in contiguous blocks: rank 1 attends 100 - 36 = 64 more (query, key) pairs
  than rank 0, 46 FLOPs each: 2944 FLOPs more, so rank 1 is the busiest.
- A 2-stage GPipe pipeline of 2 microbatches, one time unit per action
  (tests/records/test_parallel_pictures.py): rank 0 runs its forwards at 0-1 and 1-2 and its
  backwards at 4-5 and 5-6.
"""

from __future__ import annotations

import builtins
import json
import sys

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.render import notebook_figures
from exportflops.render.notebook_figures import PLOTLY_MIME

pytest.importorskip("IPython", reason="the display is IPython's")
from IPython.display import display  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

B = 2


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """IPython's shell, which ``display`` publishes through (without one it prints), made for
    the test and cleared after it, with what it sets on the process put back: ``__main__``, the
    builtins it adds (``display``, ``__IPYTHON__``); its profile in ``tmp_path``, no history."""
    from traitlets.config import Config
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        yield InteractiveShell.instance()
        return
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    names = set(vars(builtins))
    config = Config()
    config.HistoryManager.enabled = False
    yield InteractiveShell.instance(config=config)
    InteractiveShell.clear_instance()
    for added in set(vars(builtins)) - names:
        delattr(builtins, added)


def _shown(record) -> list[dict]:
    """The outputs a cell ending with ``record`` gets, as MIME bundles, in order; a display
    that fails writes its traceback, so nothing may be written besides."""
    with capture_output() as captured:
        display(record)
    assert (captured.stdout, captured.stderr) == ("", "")
    return [output.data for output in captured.outputs]


def _no_plotly(monkeypatch) -> None:
    """plotly made unimportable, its loaded modules too (an import finds them first)."""
    for name in [n for n in sys.modules if n == "plotly" or n.startswith("plotly.")] + ["plotly"]:
        monkeypatch.setitem(sys.modules, name, None)


def _assert_offline(outputs: list[dict]) -> None:
    """No output loads a script or anything from the network: no ``<script>``, nothing fetched
    by an attribute or a style (the HTML may cite a datasheet's address as text), and a picture
    is data with no address in it (plotly.js neither inline nor from a CDN)."""
    for output in outputs:
        text = json.dumps(output).lower()
        assert not [tag for tag in ("<script", "src=", "href=", "url(", "@import") if tag in text]
        if PLOTLY_MIME in output:
            picture = json.dumps(output[PLOTLY_MIME]).lower()
            assert "http" not in picture and "cdn" not in picture and "plotly.js" not in picture


def _linear_relu() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU())


def _report(model: nn.Module):
    return analyze(model, (torch.randn(B, 4),))


# --- a Report ------------------------------------------------------------------------------------

def test_a_report_shows_its_html_then_its_module_icicle(shell):
    pytest.importorskip("plotly", reason="the pictures are the html extra's")
    outputs = _shown(_report(_linear_relu()))
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"],
                                            [PLOTLY_MIME, "text/plain"]]
    html, icicle = outputs
    assert "24 MACs" in html["text/html"]  # 2 x 4 x 3, as the text views write it
    assert "FLOPs 54 (90.00%)" in html["text/html"]  # the linear: 54 of 60 FLOPs
    assert "Summary of Sequential" in html["text/plain"]  # the text view, for plain frontends
    (trace,) = icicle[PLOTLY_MIME]["data"]
    assert trace["type"] == "icicle"
    assert trace["ids"] == ["(root)", "0", "1"]
    assert trace["parents"] == ["", "(root)", "(root)"]
    assert trace["values"] == [0, 2 * 4 * 3 * B + 3 * B, 3 * B]  # own FLOPs: 0, 54, 6
    assert "module_icicle(report)" in icicle["text/plain"]
    _assert_offline(outputs)


def test_the_bundle_is_the_one_plotlys_mimetype_renderer_writes(shell):
    plotly_io = pytest.importorskip("plotly.io")
    from exportflops.render.plots import module_icicle

    report = _report(_linear_relu())
    (_, icicle) = _shown(report)
    figure = module_icicle(report).update_layout(title="The modules of Sequential by FLOPs")
    expected = plotly_io.renderers["plotly_mimetype"].to_mimebundle(figure.to_dict())
    assert icicle[PLOTLY_MIME] == expected[PLOTLY_MIME]
    assert {"data", "layout"} <= set(icicle[PLOTLY_MIME])


def test_a_big_tree_is_cut_at_the_depth_that_fits_and_the_cut_box_holds_its_children(
        shell, monkeypatch):
    pytest.importorskip("plotly", reason="the pictures are the html extra's")
    monkeypatch.setattr(notebook_figures, "MAX_BOXES", 2)
    (_, icicle) = _shown(_report(nn.Sequential(_linear_relu())))
    (trace,) = icicle[PLOTLY_MIME]["data"]
    assert trace["ids"] == ["(root)", "0"]
    assert trace["values"] == [0, (2 * 4 * 3 * B + 3 * B) + 3 * B]  # 54 + 6 under "0"
    assert "down to depth 1 of 2 (2 of 4 modules)" in icicle["text/plain"]
    assert "down to depth 1 of 2" in icicle[PLOTLY_MIME]["layout"]["title"]["text"]


def test_without_plotly_a_report_shows_its_html_alone_and_no_error(shell, monkeypatch):
    report = _report(_linear_relu())
    _no_plotly(monkeypatch)
    outputs = _shown(report)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"]]
    assert outputs[0]["text/html"] == report._repr_html_()  # the HTML as it was
    _assert_offline(outputs)


# --- a Roofline ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def h100_linear():
    from exportflops.roofline import roofline

    with torch.device("meta"):
        model, x = nn.Sequential(nn.Linear(4096, 4096, bias=False)), torch.randn(512, 4096)
    return roofline(analyze(model, (x,)), "h100-sxm")


def test_a_roofline_shows_its_html_then_its_nodes_under_the_roofs(shell, h100_linear):
    pytest.importorskip("plotly", reason="the pictures are the html extra's")
    outputs = _shown(h100_linear)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"],
                                            [PLOTLY_MIME, "text/plain"]]
    html, scatter = outputs
    assert "256.42 us (compute-bound)" in html["text/html"]
    traces = {t["name"]: t for t in scatter[PLOTLY_MIME]["data"]}
    compute_bound = traces["predicted, compute-bound"]
    (point,) = zip(compute_bound["x"], compute_bound["y"])
    flops, moved = 2 * 512 * 4096 * 4096, (512 * 4096 + 4096 * 4096 + 512 * 4096) * 4
    assert point[0] == pytest.approx(flops / moved) == pytest.approx(204.8)
    assert point[1] == pytest.approx(67e12)  # compute-bound: the rate is the float32 peak
    (roof,) = [t for name, t in traces.items() if name.startswith("roof: float32 peak")]
    assert set(roof["y"]) == {67e12}
    (memory,) = [t for name, t in traces.items() if name.startswith("roof: memory")]
    assert memory["x"][-1] == pytest.approx(67e12 / 3.35e12) == pytest.approx(20)  # the ridge
    assert memory["y"][-1] == pytest.approx(67e12)
    assert "predicted, memory-bound" not in traces  # one node, compute-bound
    _assert_offline(outputs)


def test_without_plotly_a_roofline_shows_its_html_alone(shell, monkeypatch, h100_linear):
    _no_plotly(monkeypatch)
    outputs = _shown(h100_linear)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"]]
    assert outputs[0]["text/html"] == h100_linear._repr_html_()


# --- the per-rank records ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def contiguous():
    from exportflops.parallel.context import analyze_context
    from tests.parallel.test_context_parallel import CausalAttention, ids

    return analyze_context(CausalAttention(), (ids(),), cp=2, load_balance=False)


def test_a_context_split_shows_its_tables_then_a_bar_per_rank(shell, contiguous):
    pytest.importorskip("plotly", reason="the pictures are the html extra's")
    from tests.parallel.test_context_parallel import PAIR_FLOPS

    outputs = _shown(contiguous)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"],
                                            [PLOTLY_MIME, "text/plain"]]
    (bars,) = outputs[1][PLOTLY_MIME]["data"]
    assert bars["x"] == ["rank 0", "rank 1"]
    assert bars["y"][1] - bars["y"][0] == (100 - 36) * PAIR_FLOPS == 2944
    assert bars["text"] == ["", "sets the step"]  # rank 1, the busiest
    _assert_offline(outputs)


def test_a_pipeline_shows_its_bars_and_its_timeline(shell):
    pytest.importorskip("plotly", reason="the pictures are the html extra's")
    from exportflops.examples.llama import llama
    from exportflops.parallel.pipeline import analyze_pipeline
    from tests.parallel.test_pipeline import BATCH, SEQ, SMALL

    model, args = llama("meta", SMALL, seq_len=SEQ, batch=BATCH)
    pipeline = analyze_pipeline(model, args, stages=2, schedule="gpipe", microbatches=2,
                                device=None).record
    outputs = _shown(pipeline)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"],
                                            [PLOTLY_MIME, "text/plain"],
                                            [PLOTLY_MIME, "text/plain"]]
    timeline = {t["name"]: t for t in outputs[2][PLOTLY_MIME]["data"]}
    on_rank_0 = sorted((b, b + x, name) for name, t in timeline.items()
                       for y, b, x in zip(t["y"], t["base"], t["x"]) if y == "rank 0")
    assert on_rank_0 == [(0, 1, "forward"), (1, 2, "forward"), (4, 5, "backward"),
                         (5, 6, "backward")]
    _assert_offline(outputs)


def test_without_plotly_a_per_rank_record_shows_its_html_alone(shell, monkeypatch, contiguous):
    _no_plotly(monkeypatch)
    outputs = _shown(contiguous)
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"]]
    assert outputs[0]["text/html"] == contiguous._repr_html_()
