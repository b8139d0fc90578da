"""The checks every per-rank analysis runs on a `Layout` (`exportflops.parallel.checks`): found
before the model is built, naming the arguments; and the families' entry points on a layout."""

from __future__ import annotations

import pytest
import torch

from exportflops.errors import LayoutError
from exportflops.parallel import Layout, analyze_ranks, memory_ranks
from exportflops.parallel.context import analyze_context
from exportflops.parallel.experts import analyze_experts
from tests.parallel.test_context_parallel import CausalAttention, ids


def _never_built(device):
    raise AssertionError("the model was built: the layout's check came too late")


#: What a pipeline on a layout is refused, by analyze_ranks and by analyze_pipeline alike.
PIPELINE_REFUSALS = [
    # torch's interleaved schedules take a multiple of their rounds (2 here, of 2 ranks): 5 is not.
    pytest.param(Layout(pp=2), {"schedule": "interleaved1f1b", "microbatches": 5},
                 "pp=2 schedule='interleaved1f1b': schedule 'interleaved1f1b' with 2 ranks",
                 id="microbatches-torch-refuses"),
    pytest.param(Layout(pp=2), {"schedule": "zigzag"},
                 "schedule='zigzag': the schedules are gpipe, 1f1b", id="unknown-schedule"),
    pytest.param(Layout(pp=2, cp=2), {},
                 "pp=2 cp=2: a pipeline composes with fsdp= and tp=, not with cp=",
                 id="pp-with-cp"),
]


@pytest.mark.parametrize("layout, options, words", [
    *PIPELINE_REFUSALS,
    pytest.param(Layout(tp=4, ep=2), {}, "pass ep=4, or add fsdp=F", id="ep-over-tp"),
    pytest.param(Layout(fsdp=2, tp=2), {"rank": 4},
                 "fsdp=2 tp=2 rank=4: rank= one of 0..3 (the fsdp x tp ranks)", id="rank"),
])
def test_a_layout_the_analyses_cannot_count_is_refused_before_the_model_is_built(layout, options,
                                                                                 words):
    with pytest.raises(LayoutError) as error:
        analyze_ranks(_never_built, layout=layout, **options)
    assert words in str(error.value)


@pytest.mark.parametrize("layout, options, words", PIPELINE_REFUSALS)
def test_analyze_pipeline_on_a_layout_runs_the_same_checks(layout, options, words):
    from exportflops.parallel.pipeline import analyze_pipeline

    with pytest.raises(LayoutError) as error:
        analyze_pipeline(_never_built, layout=layout, **options)
    assert words in str(error.value)


def test_memory_ranks_runs_the_same_checks():
    with pytest.raises(LayoutError, match=r"tp=2 rank=2: rank= one of 0\.\.1 \(the tp ranks\)"):
        memory_ranks(_never_built, layout=Layout(tp=2), rank=2)


def test_analyze_context_on_a_layout_is_the_record_analyze_ranks_gives():
    model, args = CausalAttention(), (ids(),)
    layout = Layout(fsdp=2, cp=2)
    assert analyze_context(model, args, layout=layout) == analyze_ranks(model, args,
                                                                        layout=layout)
    with pytest.raises(LayoutError, match="leave out cp= and fsdp="):
        analyze_context(model, args, layout=layout, cp=2)


def test_analyze_experts_on_a_layout_is_the_record_analyze_ranks_gives(tmp_path):
    from tests.parallel.test_expert_parallel import loaded_models, written_models

    model, args = loaded_models(written_models(tmp_path)).build(torch.device("meta"))
    layout = Layout(dp=2, ep=2)
    record = analyze_experts(model, args, layout=layout)
    assert record == analyze_ranks(model, args, layout=layout)
    # ep= alone is the same layout: the ep ranks each running their own batch.
    assert record == analyze_experts(model, args, ep=2)
