"""The command does what the API does: train mode, dynamic sizes and sweeps, the runtime pass and
budget comparisons (issue 12, parity). Expected counts derived by hand for the factory
``cli_models:mlp``: Linear(4, 8), ReLU, Linear(8, 2) on a (3, 4) input."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.cli_support import one_paragraph, report_of, run

ROWS = 3
MACS_PER_ROW = 4 * 8 + 8 * 2  # fc1 and fc2


def test_mode_train_counts_the_backward(models):
    """The input needs no gradient: fc1 computes its weight gradient only (3 x 4 x 8 MACs);
    fc2 its input and weight gradients (3 x 8 x 2 each)."""
    report = report_of(run("cli_models:mlp", "--mode", "train", "--format", "json", cwd=models))
    assert report.mode == "train"
    assert report.forward.macs == ROWS * MACS_PER_ROW
    assert report.backward.macs == ROWS * 4 * 8 + 2 * ROWS * 8 * 2


def test_a_dynamic_batch_swept_gives_one_row_per_size(models):
    result = run("cli_models:mlp", "--dynamic", "batch", "--sweep", "batch=2,5,64",
                 "--format", "csv", cwd=models)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(int(r["batch"]), int(r["MACs"])) for r in rows] == [
        (b, b * MACS_PER_ROW) for b in (2, 5, 64)]


def test_a_dynamic_size_named_by_its_place_and_swept_as_json(models):
    result = run("cli_models:mlp", "--dynamic", "rows=0:0", "--sweep", "rows=7",
                 "--format", "json", cwd=models)
    assert result.returncode == 0, result.stderr
    [point] = json.loads(result.stdout)
    assert point["total"]["macs"] == 7 * MACS_PER_ROW


def test_profile_times_the_forward_on_the_cpu(models):
    report = report_of(run("cli_models:mlp", "--device", "cpu", "--profile", "--warmup", "1",
                           "--repeat", "3", "--format", "json", cwd=models))
    assert report.runtime is not None
    assert (report.runtime.warmup, report.runtime.repeat) == (1, 3)
    assert report.total.macs == ROWS * MACS_PER_ROW


def test_budget_karpathy_matches_the_gpt2_example_component_by_component():
    """nanoGPT at 64 tokens, head on the last position (Karpathy's notebook's terms): the graph's
    matmul FLOPs equal the budget's forward total, so that row's difference is 0."""
    result = run("gpt2", "--input", "1,64:int64", "--budget", "karpathy", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {r["component"]: r for r in json.loads(result.stdout)["comparison"]["rows"]}
    total = rows["forward_total"]
    # 12 layers x (4 x 768^2 x 64 qkv/proj + 2 x 64^2 x 768 scores/reduce
    # + 8 x 768^2 x 64 MLP) x 2 FLOPs per MAC, + the head 2 x 768 x 50304 on one position.
    layer = 12 * 768 ** 2 * 64 + 2 * 64 ** 2 * 768
    assert total["budget_flops"] == total["counted_flops"] == 2 * (12 * layer + 768 * 50304)


@pytest.mark.parametrize(("args", "message"), [
    (["--profile"], "--profile times real runs: pass --device cpu"),
    (["--sweep", "batch=2,4"], "--sweep batch needs --dynamic batch"),
    (["--dynamic", "width"], "--dynamic width: name batch or seq"),
    (["--dynamic", "batch,seq", "--sweep", "batch=2", "--sweep", "seq=2,3"], "move together"),
    (["--dynamic", "batch", "--sweep", "batch=2", "--sweep", "batch=3"], "swept twice"),
    (["--budget", "palm"], "--budget palm: a budget compares a transformer the budgets know"),
], ids=["profile-on-meta", "sweep-not-dynamic", "unknown-name", "uneven-sweeps",
        "swept-twice", "budget-of-an-mlp"])
def test_an_analysis_that_cannot_apply_exits_2_with_a_sentence(models, args, message):
    result = run("cli_models:mlp", *args, cwd=models)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and one_paragraph(result.stderr)
