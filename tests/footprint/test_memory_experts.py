"""The memory of an expert-parallel rank (`memory_ranks` with ``Layout(dp=E, ep=E)``): its
share of each MoE layer's experts with every other parameter, and the token copies routed to
it, derived from the tiny Mixtral's shapes (tests/footprint/models.py); and a real two-process
gloo run (tests/footprint/rank_worker.py) measured per rank by torch's profiler memory
timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exportflops.errors import InputError, LayoutError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.models import FP32, MIXTRAL_PARAMS, MIXTRAL_TENSORS, mixtral
from tests.footprint.rank_models import SKEWED
from tests.torchrun import torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
EP, EXPERTS, LAYERS, HIDDEN, FFN = 2, 4, 2, 64, 128  # tests.footprint.models.mixtral
TOKENS, TOP_K = 2 * 32, 2


@pytest.fixture(scope="module")
def view():
    model, args, kwargs = mixtral()
    return memory_ranks(model, args, kwargs, layout=Layout(dp=EP, ep=EP), routing=SKEWED)


def test_an_expert_parallel_rank_holds_its_experts_and_every_other_parameter(view):
    # Each MoE layer's experts hold gate_up_proj E x 2I x H and down_proj E x H x I; a rank
    # holds E / ep of them, and every other parameter (attention, router, norms, embeddings).
    dropped = LAYERS * (EXPERTS - EXPERTS // EP) * 3 * FFN * HIDDEN
    held = (MIXTRAL_PARAMS - dropped) * FP32
    assert held == 625920
    for report in view.ranks:
        # AdamW: exp_avg and exp_avg_sq of each parameter it holds, a float32 step per tensor
        assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
                report.max_by_kind.optimizer) == (held, held, 2 * held + MIXTRAL_TENSORS * FP32)


def test_the_dispatch_receives_the_token_copies_routed_to_the_ranks_experts(view):
    # Both ranks run the same batch up to the first dispatch; its output is the copies routed to
    # the rank's experts, received x H float32: rank 1 receives 192 - 64 more rows than rank 0.
    first = [next(point for point in report.timeline
                  if point.op == "_c10d_functional.all_to_all_single.default")
             for report in view.ranks]
    assert first[0].index == first[1].index
    assert first[1].live.total - first[0].live.total == (192 - 64) * HIDDEN * FP32


def test_the_view_names_the_rank_its_routing_sends_the_most_tokens(view):
    assert [report.rank for report in view.ranks] == [0, 1]
    assert view.ranks[1].peak_bytes > view.ranks[0].peak_bytes
    assert (view.peak_rank, view.peak_bytes) == (1, view.ranks[1].peak_bytes)


@pytest.mark.parametrize("layout, options, error, words", [
    (Layout(dp=2, fsdp=2, ep=2), {}, LayoutError,
     r"Layout\(dp=2, fsdp=2, ep=2\).*dp with ep are not modelled"),
    (Layout(dp=3, ep=3), {}, InputError, r"4 experts per layer, which 3 ranks cannot hold"),
    (Layout(dp=2, ep=2), {"routing": [1, 2, 3]}, InputError,
     r"routing must give 4 counts >= 0 .* summing to 256"),
], ids=["ep-with-fsdp-replicas", "ep-not-dividing-experts", "routing-of-wrong-length"])
def test_what_an_expert_rank_does_not_model_is_refused_by_name(layout, options, error, words):
    model, args, kwargs = mixtral()
    with pytest.raises(error, match=words):
        memory_ranks(model, args, kwargs, layout=layout, rank=0, **options)


def test_two_real_gloo_expert_ranks_peak_as_the_fake_process_group_predicts(tmp_path):
    # Routing SKEWED: each rank sends 32 of its 128 token copies to rank 0 and 96 to rank 1
    # (the group's copies dealt out in turn), so the ranks' splits pair up on real ranks and
    # gloo runs each all_to_all_single; rank 1 receives 192 copies, rank 0 64.
    done = torchrun(Path(__file__).with_name("rank_worker.py"), "ep", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    model, args, kwargs = mixtral()
    view = memory_ranks(model, args, kwargs, layout=Layout(dp=EP, ep=EP), routing=SKEWED)
    measured = [min(json.loads((tmp_path / f"rank{rank}.json").read_text())["peak_bytes"])
                for rank in range(EP)]
    # the least of five steps, as tests/footprint/test_memory_ranks.py takes it: gloo's
    # thread may free a collective's buffers after the step's next allocations
    for report in view.ranks:
        assert abs(measured[report.rank] - report.peak_bytes) <= 0.03 * measured[report.rank], (
            report.rank, measured, report.peak_bytes)
    assert measured[1] > measured[0]  # the rank receiving more copies holds more
