"""`exportflops.fit` per rank of an expert-parallel layout (the tiny Mixtral of
tests/footprint/models.py, ``Layout(dp=2, ep=2)``) and of a context-parallel ring
(`attention_blocks` of tests/planner/rank_models.py, ``Layout(cp=2)``): the plan's peak is the
highest rank's `memory_ranks` peak of the planned model, and a ring's largest length is a
length it splits."""

from __future__ import annotations

import functools

import pytest
import torch

from exportflops import analyze, fit
from exportflops.checkpointing import wrapped
from exportflops.count.backward import RECOMPUTED
from exportflops.errors import InputError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import mixtral
from tests.planner.rank_models import BATCH, SEQ, attention_blocks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
CP = 2
LAYOUTS = {"ep": Layout(dp=2, ep=2), "cp": Layout(cp=CP)}


def _example(name: str) -> tuple:
    """The model and its step's inputs, without the KV cache fit() turns off (a checkpointed
    block's recompute would write it again)."""
    if name == "cp":
        return (*attention_blocks(), {})
    model, args, kwargs = mixtral()
    return model, args, {**kwargs, "use_cache": False}


@functools.cache
def _tight(name: str):
    """The plan for one byte under the plain step's highest peak (it must checkpoint), and that
    peak; the ring's also searches the largest batch and length."""
    plain = memory_ranks(*_example(name), layout=LAYOUTS[name]).peak_bytes
    return fit(*_example(name), budget=plain - 1, layout=LAYOUTS[name],
               search_batch=name == "cp"), plain


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_plans_peak_is_the_highest_ranks_peak_of_the_planned_model(name):
    plan, plain = _tight(name)
    assert plan.checkpointed or plan.selective
    ranks = memory_ranks(*_example(name), layout=LAYOUTS[name], checkpoint=plan)
    assert (plan.peak_bytes, plan.peak_rank) == (ranks.peak_bytes, ranks.peak_rank)
    assert plan.peak_bytes == max(report.peak_bytes for report in ranks.ranks) < plain
    assert plan.layout == str(LAYOUTS[name])


def test_a_rings_largest_length_is_a_length_it_splits():
    plan, _ = _tight("cp")
    # The budget is one byte under the plain step at the example's SEQ tokens, and a shorter
    # step needs fewer bytes: without the plan the largest length is the next one the ring
    # splits below SEQ, and the largest batch the next below BATCH rows.
    assert (plan.largest_length_without_plan, plan.largest_batch_without_plan) == (
        SEQ - CP, BATCH - 1)
    # The plan fits the example, so its lengths reach SEQ at least, in steps of CP.
    assert plan.largest_length >= SEQ and plan.largest_length % CP == 0
    assert plan.largest_batch >= BATCH


def test_a_routing_histogram_is_refused_for_a_search_of_other_sizes():
    # routing= counts the copies of the example's tokens: 2 ranks x 64 tokens x top-2.
    with pytest.raises(InputError, match=r"Layout\(dp=2, ep=2\): routing= gives the token "
                                         r"copies per expert of MixtralForCausalLM's example.*"
                                         r"search_batch=False"):
        fit(*_example("ep"), budget=2**30, layout=LAYOUTS["ep"], routing=[64, 64, 64, 64])


def test_the_mixtrals_selective_recompute_is_what_analyze_adds_and_no_matrix_product():
    plan, _ = _tight("ep")
    model, args, kwargs = _example("ep")
    paths = plan.blocks
    plain = analyze(model, args, kwargs, mode="train")
    with wrapped(model, [], paths) as selective:
        report = analyze(selective, args, kwargs, mode="train")
    rerun = [n for n in report.nodes if n.note.startswith(RECOMPUTED)]
    # Every block checkpointed selectively: the candidate of all blocks, the step's recompute.
    candidate = next(c for c in plan.candidates if c.selective and c.blocks == len(paths))
    assert candidate.recompute_flops == report.total.flops - plain.total.flops > 0
    assert candidate.recompute_flops == sum(n.cost.flops for n in rerun)
    # save_matmuls keeps the products (attention's, the router's, the experts' grouped one);
    # the norms' rsqrt, the experts' silu, the router's softmax and top-k rerun.
    assert not {n.op for n in rerun} & {"aten.mm.default", "aten.addmm.default",
                                         "transformers.grouped_mm_fallback.default"}
    assert {"aten.rsqrt.default", "aten.silu.default", "aten._softmax.default",
            "aten.topk.default"} <= {n.op for n in rerun}
