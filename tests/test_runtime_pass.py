"""The runtime pass: per-node timing of the replayed graph, module latencies, plain forward,
overhead and residual, MFU, and the training-loop profiler. Properties, not speeds."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from exportflops import FlopsProfiler, ProfileError, Report, analyze, profile
from exportflops.render import flops_report

B, IN, HIDDEN, OUT = 8, 32, 64, 10


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


@pytest.fixture(scope="module")
def profiled() -> Report:
    return profile(mlp(), (torch.randn(B, IN),), warmup=2, repeat=5)


def test_every_node_is_timed(profiled):
    timed = {t.name for t in profiled.runtime.nodes}
    assert timed == {n.name for n in profiled.nodes}
    assert all(0 <= t.latency.min_s <= t.latency.median_s <= t.latency.max_s
               for t in profiled.runtime.nodes)


def test_module_latencies_are_consistent_with_the_tree(profiled):
    runtime = profiled.runtime
    inclusive = {m.path: m.inclusive_s for m in runtime.modules}
    exclusive = {m.path: m.exclusive_s for m in runtime.modules}
    children = {p: [c for c in inclusive if c and c.rpartition(".")[0] == p] for p in inclusive}
    for path in inclusive:
        assert math.isclose(inclusive[path],
                            exclusive[path] + sum(inclusive[c] for c in children[path]),
                            rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(inclusive[""], sum(t.latency.median_s for t in runtime.nodes),
                        rel_tol=1e-9)


def test_plain_forward_overhead_and_residual_are_reported(profiled):
    runtime = profiled.runtime
    assert runtime.plain_total.median_s > 0 and runtime.hooked_total.median_s > 0
    assert runtime.overhead_s == pytest.approx(
        runtime.hooked_total.median_s - runtime.plain_total.median_s)
    assert runtime.residual_s == pytest.approx(
        runtime.plain_total.median_s - sum(t.latency.median_s for t in runtime.nodes))
    assert runtime.achieved_flop_per_s == pytest.approx(
        profiled.total.flops / runtime.plain_total.median_s)


def test_mfu_against_a_user_peak():
    report = profile(mlp(), (torch.randn(B, IN),), warmup=1, repeat=3, peak_flops=1e12)
    assert report.runtime.peak_flop_per_s == 1e12 and report.runtime.peak_source == "user"
    assert report.runtime.mfu == pytest.approx(report.runtime.achieved_flop_per_s / 1e12)


def test_the_runtime_round_trips_through_json(profiled):
    assert Report.model_validate_json(profiled.model_dump_json()) == profiled


def test_a_report_is_timed_on_its_own_graph_without_re_export():
    model, x = mlp(), torch.randn(B, IN)
    program = torch.export.export(model, (x,))
    report = analyze(program)
    timed = profile(report, (x,), program=program, warmup=1, repeat=3)
    assert timed.total == report.total and timed.runtime is not None


def test_flops_report_shows_latency_columns(profiled):
    tree = flops_report(profiled, view="tree")
    header = tree.splitlines()[1]
    assert "latency" in header and "% latency" in header and "FLOPS" in header
    summary = flops_report(profiled, view="summary")
    assert "MFU" in summary and "timing overhead" in summary


def test_a_model_on_meta_is_refused_with_what_to_do():
    with torch.device("meta"):
        model = mlp()
    with pytest.raises(ProfileError, match="meta"):
        profile(model, (torch.randn(B, IN, device="meta"),), repeat=1)


def test_cuda_without_cuda_says_so():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ProfileError, match="CUDA"):
        profile(mlp(), (torch.randn(B, IN),), device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_events_time_every_node():
    model, x = mlp().cuda(), torch.randn(B, IN, device="cuda")
    report = profile(model, (x,), device="cuda", warmup=2, repeat=5)
    assert report.runtime.timer.startswith("cuda")
    assert {t.name for t in report.runtime.nodes} == {n.name for n in report.nodes}
    assert report.runtime.plain_total.median_s > 0


def hooks_and_state(model: nn.Module):
    return [(dict(m._forward_hooks), dict(m._forward_pre_hooks), sorted(vars(m)))
            for m in model.modules()]


def test_training_loop_profiler_started_at_step_3():
    """Steps 0..5 of SGD on batches of 4, 5, 6, ... rows: step 3 has 7 rows. MACs of the
    captured forward: 7 * (IN * HIDDEN + HIDDEN * OUT) = 7 * 2,688 = 18,816."""
    model = mlp()
    before = hooks_and_state(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = FlopsProfiler(model, warmup=1, repeat=2)
    for step in range(6):
        x = torch.randn(4 + step, IN)
        if step == 3:
            profiler.start()
        loss = model(x).square().mean()
        if step == 3:
            profiler.stop()
            macs, params, flops = (profiler.get_total_macs(), profiler.get_total_params(),
                                   profiler.get_total_flops())
            captured = profiler.report.inputs
            profiler.end()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert [c.shape for c in captured] == [[7, IN]]
    assert macs == 7 * (IN * HIDDEN + HIDDEN * OUT) == 18_816
    # + biases (7 * 64 + 7 * 10) and ReLU (7 * 64), one FLOP per element each.
    assert flops == 2 * macs + 7 * HIDDEN + 7 * OUT + 7 * HIDDEN
    assert params == IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT
    assert hooks_and_state(model) == before
