"""`exportflops.fit` per rank of a parallel layout, on `EmbeddedBlocks` (tests/planner/
rank_models.py): the plan's peak is the highest rank's `memory_ranks` peak of the planned
model, a larger budget never gives more recompute, a pipeline's plan checkpoints each block in
the stage that holds it, and the plan applied on two real gloo ranks fits its budget on each by
torch's profiler memory timeline."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from exportflops import fit
from exportflops.checkpointing import Blocks
from exportflops.errors import LayoutError
from exportflops.parallel import Layout, memory_ranks
from exportflops.render.fit import fit_plan_view
from tests.planner.rank_models import embedded_blocks
from tests.torchrun import torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
LAYOUTS = {"tp": Layout(tp=2), "fsdp": Layout(fsdp=2), "pp": Layout(pp=2)}


@functools.cache
def _plain_peak(name: str) -> int:
    """The highest rank's peak of the step without checkpointing."""
    return memory_ranks(*embedded_blocks(), layout=LAYOUTS[name]).peak_bytes


@functools.cache
def _plan(name: str, budget: int):
    return fit(*embedded_blocks(), budget=budget, layout=LAYOUTS[name], search_batch=False)


def _tight(name: str):
    """The plan for one byte under the plain step's highest peak: it must checkpoint."""
    return _plan(name, _plain_peak(name) - 1)


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_plans_peak_is_the_highest_ranks_peak_of_the_planned_model(name):
    plan = _tight(name)
    assert plan.checkpointed or plan.selective
    ranks = memory_ranks(*embedded_blocks(), layout=LAYOUTS[name], checkpoint=plan)
    assert (plan.peak_bytes, plan.peak_rank) == (ranks.peak_bytes, ranks.peak_rank)
    assert plan.peak_bytes == max(report.peak_bytes for report in ranks.ranks)
    assert plan.peak_bytes <= plan.budget_bytes and plan.layout == str(LAYOUTS[name])
    view = fit_plan_view(plan)
    assert f"kB) per rank of {LAYOUTS[name]}, training step" in view
    assert f"(rank {ranks.peak_rank}, the highest); recompute" in view


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_larger_per_rank_budget_never_gives_more_recompute(name):
    # The budgets: each candidate's peak, where the candidates that fit change.
    budgets = sorted({c.peak_bytes for c in _tight(name).candidates})
    recomputes = [_plan(name, budget).recompute_flops for budget in budgets]
    assert recomputes == sorted(recomputes, reverse=True)
    assert recomputes[-1] == 0 and recomputes[0] > 0


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_candidate_with_less_recompute_than_the_plan_peaks_over_the_budget(name):
    plan = _tight(name)
    chosen = next(c for c in plan.candidates
                  if (c.blocks, c.selective) == (len(plan.checkpointed or plan.selective),
                                                 bool(plan.selective)))
    assert chosen.peak_bytes == plan.peak_bytes <= plan.budget_bytes
    cheaper = [c for c in plan.candidates if c.recompute_flops < plan.recompute_flops]
    # The plain step is one of them, and one byte over the budget by construction.
    assert cheaper and all(c.peak_bytes > plan.budget_bytes for c in cheaper)


@pytest.mark.parametrize(("stage_rank", "block"), [(0, "blocks.0"), (1, "blocks.1")])
def test_a_pipeline_checkpoints_each_block_in_the_stage_that_holds_it_only(stage_rank, block):
    # Layout(pp=2) splits the two blocks one a stage: rank 0 holds the embedding and blocks.0,
    # rank 1 blocks.1. Checkpointing a block changes its own stage's step and not the other's.
    layout = Layout(pp=2)
    plain = memory_ranks(*embedded_blocks(), layout=layout)
    planned = memory_ranks(*embedded_blocks(), layout=layout, checkpoint=Blocks([block]))
    other = 1 - stage_rank
    assert planned.ranks[other].timeline == plain.ranks[other].timeline
    # Reentrant checkpointing keeps a block's input, not what its ops saved, across the stage's
    # microbatches in flight.
    assert (planned.ranks[stage_rank].max_by_kind.activations
            < plain.ranks[stage_rank].max_by_kind.activations)


def test_a_pipeline_refuses_a_block_no_stage_calls_whole_by_name():
    # torch's pipeline() split runs each stage's blocks as submodules of its graph; the
    # ModuleList holding them is never called, so wrapping it would checkpoint nothing.
    with pytest.raises(LayoutError, match=r"Layout\(pp=2\): EmbeddedBlocks's block 'blocks' "
                                          r"is not a module any pipeline stage calls whole"):
        memory_ranks(*embedded_blocks(), layout=Layout(pp=2), checkpoint=Blocks(["blocks"]))


@pytest.mark.parametrize("name", ["tp", "fsdp"])
def test_the_plan_applied_on_two_real_gloo_ranks_fits_its_budget_on_each(tmp_path, name):
    plan = _tight(name)
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    done = torchrun(Path(__file__).with_name("rank_fit_worker.py"), name, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())["peak_bytes"]
        # gloo's thread drops a collective's work, and the tensors it holds, when it gets to
        # it: now and then after the step's next allocations, which adds an FSDP2 all-gather
        # output (8320 bytes here) to that step's peak (tests/footprint/test_memory_ranks.py).
        # The step whose frees follow the Python code is the least of those measured.
        assert min(measured) <= plan.budget_bytes, (rank, measured)
