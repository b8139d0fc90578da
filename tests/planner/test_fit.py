"""exportflops.fit: plans applied for real on cpu and measured by torch's profiler."""

from __future__ import annotations

import functools
import random
import re

import pytest
import torch

import exportflops
from exportflops.errors import DoesNotFitError, InputError
from exportflops.examples.gpt2 import GPT, GPTConfig
from exportflops.planner import cheapest
from exportflops.records.fit import FitCandidate
from exportflops.planner.budget import HEADROOM, budget_bytes
from tests.footprint.models import CASES, hf_loss, summed
from tests.footprint.profiled import profiled, training_step


def gpt():
    """GPT-2's shape narrowed to 4 layers, so checkpointing 0..4 blocks gives distinct peaks."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=64, vocab_size=256, n_layer=4, n_head=2, n_embd=64)
    return GPT(config), (torch.randint(0, 256, (2, 64)),), {}


def llama():
    """The 4-layer Llama, trained as a checkpointed transformers model is: without a KV cache
    (fit plans that step; a selective block's replay refuses a cache written twice)."""
    model, args, kwargs = CASES["llama-4-layers"].build()
    return model, args, {**kwargs, "use_cache": False}


MODELS = {"gpt2-shaped": (gpt, summed), "llama-4-layers": (llama, hf_loss)}


@functools.cache
def _plan(name: str) -> exportflops.FitPlan:
    """The plan at a budget no candidate misses: every candidate measured, none chosen."""
    build, loss = MODELS[name]
    model, args, kwargs = build()
    return exportflops.fit(model, args, kwargs, budget="1TiB", loss=loss, search_batch=False)


def _candidates(name: str):
    return _plan(name).candidates


def _budgets(name: str, count: int) -> list[int]:
    """``count`` budgets from the least peak of any plan up to the plain one."""
    candidates = _candidates(name)
    low, high = min(c.peak_bytes for c in candidates), candidates[0].peak_bytes
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
    # Selective plans are in the sweep, chosen between whole blocks and none.
    assert {plan.selective for plan in plans} == {False, True}


@pytest.mark.parametrize("timed", [False, True], ids=["flops", "seconds"])
def test_the_plan_is_the_least_recompute_that_fits_whatever_the_order(timed):
    """Candidates made up here: a larger budget admits more of them, so the least recompute
    never grows, in whatever order the candidates come."""
    rng = random.Random(0)
    candidates = [FitCandidate(
        blocks=rng.randrange(5), selective=rng.random() < 0.5, peak_bytes=rng.randrange(1, 100),
        recompute_flops=rng.randrange(1000),
        recompute_time_s=rng.random() if timed else None) for _ in range(40)]
    chosen = [cheapest(candidates, budget) for budget in range(1, 101)]
    cost = [None if c is None else (c.recompute_time_s if timed else c.recompute_flops)
            for c in chosen]
    known = [c for c in cost if c is not None]
    assert known == sorted(known, reverse=True)
    assert cost[-1] == min(c.recompute_time_s if timed else c.recompute_flops
                           for c in candidates)


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
    # One row per candidate, 0..4 whole blocks of the 4-layer GPT then 1..4 selective, the
    # first one chosen.
    rows = [re.split(r"\s{2,}", line)[0] for line in text.splitlines()[-9:]]
    assert rows == ["0 (chosen)", "1", "2", "3", "4", "1 selective", "2 selective",
                    "3 selective", "4 selective"]
