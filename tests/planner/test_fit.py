"""exportflops.fit: plans applied for real on cpu and measured by torch's profiler."""

from __future__ import annotations

import functools

import pytest
import torch

import exportflops
from exportflops.errors import DoesNotFitError, InputError
from exportflops.examples.gpt2 import GPT, GPTConfig
from exportflops.planner import cheapest
from exportflops.planner.budget import HEADROOM, budget_bytes
from tests.footprint.models import CASES, hf_loss, summed
from tests.footprint.profiled import profiled, training_step


def gpt():
    """GPT-2's shape narrowed to 4 layers, so checkpointing 0..4 blocks gives distinct peaks."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=64, vocab_size=256, n_layer=4, n_head=2, n_embd=64)
    return GPT(config), (torch.randint(0, 256, (2, 64)),), {}


MODELS = {"gpt2-shaped": (gpt, summed), "llama-4-layers": (CASES["llama-4-layers"].build, hf_loss)}


@functools.cache
def _plan(name: str) -> exportflops.FitPlan:
    """The plan at a budget no candidate misses: every candidate measured, none chosen."""
    build, loss = MODELS[name]
    model, args, kwargs = build()
    return exportflops.fit(model, args, kwargs, budget="1TiB", loss=loss, search_batch=False)


def _candidates(name: str):
    return _plan(name).candidates


def _budgets(name: str, count: int) -> list[int]:
    """``count`` budgets from the all-checkpointed peak up to the plain one."""
    candidates = _candidates(name)
    low, high = candidates[-1].peak_bytes, candidates[0].peak_bytes
    assert low < high  # otherwise the model cannot tell plans apart
    return [low + (high - low) * i // (count - 1) for i in range(count)]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("step", [0, 1, 2], ids=["lowest", "middle", "highest"])
def test_an_applied_plan_runs_under_its_budget_and_recomputes_what_analyze_counts(name, step):
    build, loss = MODELS[name]
    budget = _budgets(name, 5)[step + 1] - 1  # three budgets strictly between the two peaks
    model, args, kwargs = build()
    plain = exportflops.analyze(model, args, kwargs, mode="train").total.flops
    plan = exportflops.fit(model, args, kwargs, budget=budget, loss=loss, search_batch=False)
    checkpointed = exportflops.analyze(plan.apply(model), args, kwargs, mode="train")
    assert plan.recompute_flops == checkpointed.total.flops - plain
    measured = profiled(training_step(model, lambda: loss(model(*args, **kwargs))))
    assert measured.peak_bytes <= budget


@pytest.mark.parametrize("name", MODELS)
def test_a_larger_budget_never_gives_more_recompute(name):
    plans = [cheapest(_candidates(name), budget) for budget in _budgets(name, 10)]
    recompute = [plan.recompute_flops for plan in plans]
    assert all(plan is not None for plan in plans)
    assert recompute == sorted(recompute, reverse=True)
    assert recompute[0] > recompute[-1] == 0  # the sweep spans all to none checkpointed


def test_the_largest_batch_that_fits_runs_under_the_budget_and_one_more_row_does_not():
    model, args, kwargs = gpt()
    budget = 2 * _candidates("gpt2-shaped")[0].peak_bytes  # twice the example's plain peak
    plan = exportflops.fit(model, args, kwargs, budget=budget, loss=summed)
    rows = plan.largest_batch_without_plan
    assert rows >= 2  # the example's two rows fit without checkpointing

    def peak(batch: int) -> int:
        model, _, _ = gpt()
        ids = torch.randint(0, 256, (batch, 64))
        return profiled(training_step(model, lambda: model(ids).sum())).peak_bytes

    assert peak(rows) <= budget < peak(rows + 1)


def test_nothing_fits_names_the_smallest_peak_and_what_holds_it():
    model, args, kwargs = gpt()
    # The peak of every plan measured at a budget that fits them all: the least of them.
    least = min(c.peak_bytes for c in _candidates("gpt2-shaped"))
    with pytest.raises(DoesNotFitError, match=rf"into 1000 bytes: the smallest peak reachable "
                                              rf"is {least} bytes, with \d of 4 blocks "
                                              rf"checkpointed; it holds parameters \d+"):
        exportflops.fit(model, args, kwargs, budget=1000, loss=summed, search_batch=False)


def test_a_plan_applies_once():
    model, args, kwargs = gpt()
    plan = exportflops.fit(model, args, kwargs, budget="1TiB", loss=summed,
                           search_batch=False).model_copy(
        update={"checkpointed": ["transformer.h.0"]})
    plan.apply(model)
    with pytest.raises(InputError, match="'transformer.h.0' of GPT is already checkpointed"):
        plan.apply(model)


@pytest.mark.parametrize(("budget", "expected"), [
    (123, 123), ("80GiB", 80 * 2**30), ("40GB", 40 * 10**9), ("1.5MiB", 3 * 2**19),
], ids=["bytes", "GiB", "GB", "fraction"])
def test_a_budget_reads_bytes_and_sizes(budget, expected):
    assert budget_bytes(budget)[0] == expected


def test_a_device_budget_is_its_capacity_less_the_headroom():
    # H100 SXM5: 80 GB of HBM3 (NVIDIA's H100 datasheet), the table reads GB as 10^9 bytes.
    assert budget_bytes("h100-sxm")[0] == int(80 * 10**9 * (1 - HEADROOM))


@pytest.mark.parametrize("budget", [0, -5, 1.5, "eighty"], ids=["zero", "negative", "float",
                                                                 "unknown"])
def test_a_budget_that_is_no_size_is_refused(budget):
    with pytest.raises(exportflops.ExportFlopsError):
        budget_bytes(budget)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")  # what it refuses
def test_a_plan_that_would_lose_a_blocks_gradients_is_refused():
    # TwoBlocks feeds the raw input, which needs no gradient, to its first block.
    from tests.parallel_models import two_blocks

    model, args = two_blocks()
    with pytest.raises(InputError, match="Checkpointing 'blocks.0' of TwoBlocks .reentrant. "
                                         "leaves its parameters without gradients"):
        exportflops.fit(model, args, budget="1GiB", search_batch=False)


def test_a_plan_round_trips_through_json_and_its_table_marks_the_chosen_plan():
    plan = _plan("gpt2-shaped")
    assert exportflops.FitPlan.model_validate_json(plan.model_dump_json()) == plan
    from exportflops.render.fit import fit_plan_view

    text = fit_plan_view(plan)
    assert text.splitlines()[1] == "checkpoint: nothing: the step fits as it is"
    # One row per candidate, 0..4 blocks of the 4-layer GPT, the first one chosen.
    rows = [line.split()[0] for line in text.splitlines()[-5:]]
    assert rows == ["0", "1", "2", "3", "4"] and "0 (chosen)" in text
