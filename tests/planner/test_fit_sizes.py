"""exportflops.fit's largest sequence length, with the plan and without, run for real on cpu
and measured by torch's profiler: it fits, and one more token does not."""

from __future__ import annotations

import torch

import exportflops
from exportflops.examples.gpt2 import GPT, GPTConfig
from tests.footprint.models import summed
from tests.footprint.profiled import profiled, training_step

ROWS, LENGTH = 2, 64


def gpt() -> GPT:
    """GPT-2's shape narrowed to 4 layers; 256 positions, so lengths past the example's 64 fit."""
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=256, vocab_size=256, n_layer=4, n_head=2, n_embd=64))


def _measured(length: int, plan: exportflops.FitPlan | None = None) -> int:
    """The profiler's peak of step 2 of a real training loop at ``length`` tokens."""
    model = gpt() if plan is None else plan.apply(gpt())
    ids = torch.randint(0, 256, (ROWS, length))
    return profiled(training_step(model, lambda: model(ids).sum())).peak_bytes


def test_the_longest_sequence_that_fits_runs_under_the_budget_and_one_more_token_does_not():
    ids = torch.randint(0, 256, (ROWS, LENGTH))
    plan = exportflops.fit(gpt(), (ids,), budget="1TiB", loss=summed, search_batch=False)
    plain = plan.candidates[0].peak_bytes
    checkpointed = min(c.peak_bytes for c in plan.candidates)
    budget = (plain + checkpointed) // 2  # the example fits only with a plan
    plan = exportflops.fit(gpt(), (ids,), budget=budget, loss=summed)
    assert (plan.checkpointed or plan.selective) and plan.example_length == LENGTH
    longest, plain_longest = plan.largest_length, plan.largest_length_without_plan
    assert plain_longest < LENGTH <= longest < 256  # the budget's bound, not the table's
    assert _measured(longest, plan) <= budget < _measured(longest + 1, plan)
    assert _measured(plain_longest) <= budget < _measured(plain_longest + 1)
