"""The per-rank pictures (`rank_flops_bars`, `pipeline_timeline`), the per-rank page
(`parallel_page`, ``--format html`` with ``--pp``, ``--ep``, ``--cp``) and the per-rank records'
``_repr_html_``, the pages opened in a real headless Chromium (tests/browser.py; skipped where
there is none).

The numbers, by hand:

- Pipeline: the small Llama of tests/parallel/test_pipeline.py in p = 2 stages, m = 2
  microbatches, GPipe, one time unit per action. GPipe runs every forward, then every backward;
  an action starts when its rank is free and its input is there:
  rank 0: F0 0-1, F1 1-2; rank 1: F0 1-2 (after rank 0's F0), F1 2-3, B0 3-4, B1 4-5;
  rank 0: B0 4-5 (after rank 1's B0), B1 5-6. The step ends at 6, on rank 0; each rank is
  busy 4 of 6 units: a bubble of (p - 1)/(m + p - 1) = 1/3 = 33.33%, idle on rank 0 from 2 to
  4. 2 stages x 2 microbatches x (F + B) = 8 actions.
- Context: tests/parallel/test_context_parallel.py's causal attention on T = 16 positions,
  cp = 2, forward: contiguous blocks give rank 0 36 causal pairs (1 + ... + 8) and rank 1 100
  (9 + ... + 16); 46 FLOPs per pair (2 heads x (2 x (4 + 4) + scale 1 + softmax 5 + mask 1)).
  The rest of the work is the same on both halves, so rank 1 does (100 - 36) x 46 = 2944 FLOPs
  more. Round-robin gives both ranks 68 pairs: equal bars.
- Experts: tests/parallel/test_expert_parallel.py's two-layer MoE (E = 4, top 2, H = 8, F = 16),
  ep = 2, routing 4,4,20,4: rank 0 holds experts 0-1, 4 + 4 = 8 copies per layer, rank 1
  experts 2-3, 20 + 4 = 24. A copy through its expert: (1, H) @ (H, F) is 2 x 8 x 16 = 256
  FLOPs, relu 16, (1, F) @ (F, H) 256: 528 FLOPs. Rank 1 does 2 layers x (24 - 8) x 528 =
  16896 FLOPs more; it is the busiest.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import exportflops
from exportflops.cli import main
from exportflops.examples.llama import llama
from exportflops.parallel.context import analyze_context
from exportflops.parallel.experts import analyze_experts
from exportflops.parallel.pipeline import analyze_pipeline
from exportflops.render.html import CONTENT_SECURITY_POLICY, parallel_page
from exportflops.render.palette import COLORS
from exportflops.render.plots import pipeline_timeline, rank_flops, rank_flops_bars
from tests.browser import Browser, find_chromium
from tests.parallel.test_context_parallel import PAIR_FLOPS, CausalAttention, ids
from tests.parallel.test_expert_parallel import loaded_models, written_models
from tests.parallel.test_pipeline import BATCH, SEQ, SMALL

pytest.importorskip("plotly", reason="the per-rank pictures need the html extra (plotly)")

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install "
                                                            "chromium; .ci/run does)")

P, M = 2, 2
ACTIONS = P * M * 2  # every stage's forward and backward of every microbatch
FLOPS_PER_COPY = 2 * 8 * 16 + 16 + 2 * 16 * 8  # up matmul, relu, down matmul: 528


@pytest.fixture(scope="module")
def small_llama():
    return llama("meta", SMALL, seq_len=SEQ, batch=BATCH)


@pytest.fixture(scope="module")
def pipeline(small_llama):
    model, args = small_llama
    return analyze_pipeline(model, args, stages=P, schedule="gpipe", microbatches=M,
                            device=None).record


@pytest.fixture(scope="module")
def contiguous():
    return analyze_context(CausalAttention(), (ids(),), cp=2, load_balance=False)


@pytest.fixture(scope="module")
def round_robin():
    return analyze_context(CausalAttention(), (ids(),), cp=2)


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    return written_models(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def skewed(models_file):
    model, args = loaded_models(models_file).build("cpu")
    return analyze_experts(model, args, ep=2, routing=[4, 4, 20, 4])


# --- the figures, read as data -------------------------------------------------------------------

def _bars(figure, rank: int) -> list[tuple[float, float, str]]:
    """(start, end, kind) of each bar on ``rank``'s row of the timeline, by start."""
    return sorted((b, b + x, trace.name) for trace in figure.data
                  for y, b, x in zip(trace.y, trace.base, trace.x) if y == f"rank {rank}")


def test_the_timeline_draws_each_action_where_gpipe_puts_it(pipeline):
    figure = pipeline_timeline(pipeline)
    assert _bars(figure, 0) == [(0, 1, "forward"), (1, 2, "forward"), (4, 5, "backward"),
                                (5, 6, "backward")]  # idle from 2 to 4: a gap, no bar
    assert _bars(figure, 1) == [(1, 2, "forward"), (2, 3, "forward"), (3, 4, "backward"),
                                (4, 5, "backward")]
    colors = {trace.name: trace.marker.color for trace in figure.data}
    assert colors == {"forward": COLORS["forward"], "backward": COLORS["backward"]}
    assert "bubble 33.33%" in figure.layout.title.text  # (p - 1)/(m + p - 1) = 1/3


def test_pipeline_ranks_add_up_to_m_single_device_steps_and_rank_0_ends_it(small_llama,
                                                                           pipeline):
    model, args = small_llama
    whole = exportflops.analyze(model, args, mode="train")
    drawn = rank_flops(pipeline)
    assert sum(drawn.flops) == M * whole.total.flops  # every microbatch through every stage
    assert drawn.step_rank == 0  # stage 0's last backward ends the step (module docstring)
    (bars,) = rank_flops_bars(pipeline).data
    assert list(bars.marker.pattern.shape) == ["/", ""]  # the step's rank hatched
    assert list(bars.text) == ["sets the step", ""]


def test_contiguous_context_ranks_differ_by_the_extra_causal_pairs(contiguous, round_robin):
    (bars,) = rank_flops_bars(contiguous).data
    assert list(bars.x) == ["rank 0", "rank 1"]
    assert bars.y[1] - bars.y[0] == (100 - 36) * PAIR_FLOPS == 2944
    assert list(bars.marker.pattern.shape) == ["", "/"]  # rank 1 is the busiest
    (balanced,) = rank_flops_bars(round_robin).data
    assert balanced.y[0] == balanced.y[1]  # 68 pairs each


def test_the_skewed_expert_rank_is_drawn_busiest(skewed):
    (bars,) = rank_flops_bars(skewed).data
    assert bars.y[1] - bars.y[0] == 2 * (24 - 8) * FLOPS_PER_COPY == 16896
    assert list(bars.text) == ["", "sets the step"]


def test_a_record_without_ranks_is_refused_by_name():
    with pytest.raises(TypeError, match="PipelineReport, ExpertParallelReport"):
        rank_flops(SimpleNamespace())


# --- the pages in Chromium -----------------------------------------------------------------------

def _open(path) -> SimpleNamespace:
    count = "document.querySelectorAll({!r}).length".format
    title = "(document.querySelector({!r}) || {{textContent: ''}}).textContent".format
    with Browser(CHROMIUM) as browser:
        browser.open(path.as_uri())
        seen = SimpleNamespace(
            url=path.as_uri(),
            rank_bars=browser.evaluate(count("#rank-flops .barlayer .point")),
            action_bars=browser.evaluate(count("#timeline .barlayer .point")),
            timeline_title=browser.evaluate(title("#timeline .gtitle")),
            tables=browser.evaluate(count(".exportflops table")),
            text=browser.evaluate("document.body.innerText"),
            policy=browser.evaluate("document.querySelector('meta[http-equiv="
                                    "\"Content-Security-Policy\"]').content"))
        seen.requests = browser.requested_urls()
        seen.messages = browser.messages()
    return seen


def _offline_and_quiet(seen) -> None:
    assert [u for u in seen.requests if u != seen.url and not u.startswith("data:")] == []
    assert seen.url in seen.requests
    assert seen.policy == CONTENT_SECURITY_POLICY
    assert seen.messages == []  # no script error, no blocked request


@needs_chromium
def test_the_pipeline_page_draws_a_bar_per_rank_and_per_action(pipeline, tmp_path):
    path = tmp_path / "pipeline.html"
    path.write_text(parallel_page(pipeline))
    seen = _open(path)
    _offline_and_quiet(seen)
    assert seen.rank_bars == P and seen.action_bars == ACTIONS
    assert "bubble 33.33%" in seen.timeline_title
    assert seen.tables == 2 and "Step: 6 units, set by rank 0" in seen.text


@needs_chromium
def test_the_command_writes_the_context_page(tmp_path, capsys):
    path = tmp_path / "cp.html"
    assert main(["llama", "--cp", "2", "--no-load-balance", "--input", "1,256:int64",
                 "--format", "html", "--output", str(path)]) == 0, capsys.readouterr().err
    seen = _open(path)
    _offline_and_quiet(seen)
    assert seen.rank_bars == 2 and seen.action_bars == 0  # no timeline without a pipeline
    # 256 positions in 2 blocks: rank 0 1 + ... + 128 = 8256 pairs, rank 1 the other
    # 256 x 257 / 2 - 8256 = 24640; rank 1 is marked.
    assert "8256" in seen.text and "24640" in seen.text and "1 *" in seen.text


@needs_chromium
def test_the_command_writes_the_pipeline_and_expert_pages(models_file, tmp_path, capsys):
    pp = tmp_path / "pp.html"
    assert main(["llama", "--pp", "2", "--microbatches", "4", "--schedule", "1f1b",
                 "--mode", "train", "--format", "html", "--output", str(pp)]) == 0, \
        capsys.readouterr().err
    seen = _open(pp)
    _offline_and_quiet(seen)
    assert seen.rank_bars == 2 and seen.action_bars == 2 * 4 * 2  # stages x m x (F + B)
    ep = tmp_path / "ep.html"
    assert main([f"{models_file}:build", "--ep", "2", "--routing", "4,4,20,4", "--rank", "1",
                 "--format", "html", "--output", str(ep)]) == 0, capsys.readouterr().err
    seen = _open(ep)
    _offline_and_quiet(seen)
    assert seen.rank_bars == 2 and "All-to-alls of rank 1 of 2" in seen.text


def test_csv_stays_refused_for_the_per_rank_analyses(capsys):
    assert main(["llama", "--pp", "2", "--format", "csv"]) == 2
    assert "--format csv" in capsys.readouterr().err


# --- what a notebook shows -----------------------------------------------------------------------

@needs_chromium
def test_each_per_rank_record_shows_its_tables_in_a_notebook(pipeline, contiguous, skewed,
                                                             tmp_path):
    shown = {"pipeline": pipeline._repr_html_(), "context": contiguous._repr_html_(),
             "experts": skewed._repr_html_()}
    assert all("<script" not in body for body in shown.values())
    path = tmp_path / "cells.html"
    path.write_text(f"<html><head><meta http-equiv='Content-Security-Policy' "
                    f"content=\"{CONTENT_SECURITY_POLICY}\"></head><body>"
                    + "".join(f"<div id='{k}'>{v}</div>" for k, v in shown.items())
                    + "</body></html>")
    with Browser(CHROMIUM) as browser:
        browser.open(path.as_uri())
        text = {k: browser.evaluate(f"document.getElementById({k!r}).innerText")
                for k in shown}
        tables = browser.evaluate("document.querySelectorAll('table').length")
        messages = browser.messages()
    assert messages == [] and tables == 2 + 2 + 2  # two tables per view
    assert "33.33%" in text["pipeline"] and "set by rank 0" in text["pipeline"]
    assert "36" in text["context"] and "100" in text["context"] and "1 *" in text["context"]
    assert "Rank 1 is the busiest" in text["experts"]
