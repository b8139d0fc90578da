"""The memory of a pipeline rank's step (`exportflops.parallel.memory_ranks` with
``Layout(pp=2)``): what a stage of `tests.footprint.rank_models.pipeline_model` holds, derived
from its shapes, with the microbatches each of torch's schedules keeps in flight, and a real
two-process gloo run of torch.distributed.pipelining (tests/footprint/pipeline_worker.py)
measured per rank by torch's profiler memory timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exportflops.errors import InputError, LayoutError
from exportflops.parallel import Layout, memory_ranks
from tests.footprint.rank_models import MICROBATCHES, pipeline_model
from tests.parallel_models import BATCH, FFN, HIDDEN, SEQ
from tests.torchrun import torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element
TOKENS = BATCH * SEQ
#: One microbatch through a NormMLP block, what autograd saves: LayerNorm its mean and rstd
#: (one each per token; its input is the stage's input), up the normed input (T x H), relu
#: its output (T x F), which down saves too (one storage).
SAVED = (2 * TOKENS + TOKENS * HIDDEN + TOKENS * FFN) * F32
#: A stage's block: LayerNorm weight and bias (2H), up H x F and down F x H.
BLOCK = (2 * HIDDEN + 2 * HIDDEN * FFN) * F32
HIDDEN_STATE = TOKENS * HIDDEN * F32  # what one stage sends the other per microbatch


def _rank(schedule: str, rank: int, **options):
    model, args = pipeline_model()
    return memory_ranks(model, args, layout=Layout(pp=2), rank=rank, schedule=schedule,
                        microbatches=MICROBATCHES, **options)


@pytest.mark.parametrize(("schedule", "rank", "in_flight"), [
    # GPipe runs every forward before any backward: all M microbatches in flight.
    ("gpipe", 0, MICROBATCHES), ("gpipe", 1, MICROBATCHES),
    # torch's Schedule1F1B warms stage s up with min(M, pp - s) forwards, then runs one
    # backward and one forward: pp - s in flight.
    ("1f1b", 0, 2), ("1f1b", 1, 1)], ids=["gpipe-0", "gpipe-1", "1f1b-0", "1f1b-1"])
def test_a_stage_holds_the_activations_of_the_microbatches_its_schedule_keeps_in_flight(
        schedule, rank, in_flight):
    report = _rank(schedule, rank)
    assert SAVED == 5248
    assert report.max_by_kind.activations == in_flight * SAVED
    # 1. one block per stage: its parameters, their gradients (accumulated over the
    #    microbatches in place), AdamW's two states per element and a 0-dim step for each of
    #    the 4 parameters.
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients,
            report.max_by_kind.optimizer) == (BLOCK, BLOCK, 2 * BLOCK + 4 * F32)
    # 2. stage 0 holds the batch (M microbatches) and a buffer per microbatch for the gradient
    #    stage 1 sends back; stage 1 a buffer per microbatch for the hidden state it receives.
    assert report.max_by_kind.inputs == (2 if rank == 0 else 1) * MICROBATCHES * HIDDEN_STATE
    assert (report.world_size, report.rank) == (2, rank)


def test_the_last_stages_forwards_hold_its_block_and_its_receive_buffers_and_no_loss():
    # mode="forward" runs torch's eval(): the forwards under no_grad, no loss computed.
    report = _rank("gpipe", 1, mode="forward")
    assert (report.max_by_kind.parameters, report.max_by_kind.gradients) == (BLOCK, 0)
    assert report.max_by_kind.inputs == MICROBATCHES * HIDDEN_STATE


def test_every_pipeline_rank_is_reported_and_the_view_names_the_highest():
    model, args = pipeline_model()
    view = memory_ranks(model, args, layout=Layout(pp=2), schedule="gpipe",
                        microbatches=MICROBATCHES)
    assert [report.rank for report in view.ranks] == [0, 1]
    # Both stages hold all 4 microbatches' activations and the same block; stage 0 holds the
    # batch and the gradient buffers (8192 bytes of inputs) against stage 1's 4096.
    assert view.peak_rank == 0


@pytest.mark.parametrize(("layout", "options", "error", "words"), [
    # TwoBlocks has no stages of its own modules (the built-in Llama's, a transformers
    # Llama's) for its tensor-parallel plan to split
    (Layout(pp=2, tp=2), {}, LayoutError,
     r"Layout\(pp=2, tp=2\).*TwoBlocks .*is not modelled yet: pass Layout\(pp=P\) alone"),
    (Layout(pp=2), {"schedule": "zbvzerobubble"}, InputError, r"split backward is not"),
], ids=["pp-with-tp", "zero-bubble"])
def test_a_pipeline_it_does_not_model_is_refused_by_name(layout, options, error, words):
    model, args = pipeline_model()
    with pytest.raises(error, match=words):
        memory_ranks(model, args, layout=layout, rank=0, **options)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_real_gloo_stages_peak_as_the_replayed_schedule_predicts(tmp_path, schedule):
    worker = Path(__file__).with_name("pipeline_worker.py")
    done = torchrun(worker, schedule, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        predicted = _rank(schedule, rank).peak_bytes
        measured = min(json.loads((tmp_path / f"rank{rank}.json").read_text())["peak_bytes"])
        assert abs(measured - predicted) <= 0.03 * measured, (rank, measured, predicted)
