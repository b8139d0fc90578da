"""``benchmarks/gpu.py`` works before a GPU runs it: without CUDA it says so and exits 0; its dry
run goes through every part on the CPU with tiny models; its test selection finds the tests
that need CUDA; its torchtitan count is the formula worked out by hand for the dry run's
Llama."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu():
    return importlib.import_module("benchmarks.gpu")  # the script, from the repository root


# The dry run's training Llama: width 32, 2 layers, 4 query heads and 2 key/value heads of 8,
# SwiGLU width 64, vocabulary 96; 2 rows of 16 tokens.
DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, ROWS, SEQ = 32, 2, 4, 2, 8, 64, 96, 2, 16
# Per layer: wq 32x32, wk and wv 32x16, wo 32x32, w1 w2 w3 32x64 each.
MATMUL_PER_LAYER = DIM * HEADS * HEAD_DIM * 2 + DIM * KV_HEADS * HEAD_DIM * 2 + 3 * DIM * FFN
# The output projection 96x32 (the token embedding is a lookup; torchtitan leaves it out).
MATMUL_WEIGHTS = LAYERS * MATMUL_PER_LAYER + VOCAB * DIM
NORM_WEIGHTS = (2 * LAYERS + 1) * DIM  # two RMSNorms per layer and the final one
ATTENTION_PER_TOKEN = 12 * LAYERS * HEADS * (DIM // HEADS) * SEQ  # 12 L H Q T


def test_the_plan_is_the_llama_these_numbers_describe(gpu):
    config = gpu.CPU_PLAN.train
    assert (config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.head_dim,
            config.ffn_dim, config.vocab_size) == (DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN,
                                                   VOCAB)
    assert (gpu.CPU_PLAN.train_batch, gpu.CPU_PLAN.train_seq) == (ROWS, SEQ)


def test_torchtitans_count_is_6n_plus_12lhqt_with_the_norms_in_n(gpu):
    """N = every parameter but the token embedding: 2 x 9216 matmul weights + 3072 output +
    160 norm weights = 21664; per token 6 x 21664 + 12 x 2 x 4 x 8 x 16 = 142272."""
    torch.manual_seed(0)
    model = gpu.Llama(gpu.CPU_PLAN.train)
    assert MATMUL_WEIGHTS + NORM_WEIGHTS == 21664
    assert gpu.torchtitan_flops_per_token(model, gpu.CPU_PLAN.train, SEQ) == 142272 == (
        6 * (MATMUL_WEIGHTS + NORM_WEIGHTS) + ATTENTION_PER_TOKEN)


@pytest.fixture(scope="module")
def dry_run(gpu):
    """The dry run without the test part (collected in its own test below)."""
    trained = {}
    train_steps = gpu.train_steps

    def kept(*args, **kwargs):
        trained.update(train_steps(*args, **kwargs))
        return trained

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu, "train_steps", kept)
        code = gpu.main(["--cpu-dry-run", "--skip-tests"])
    return code, trained


def test_the_dry_run_goes_through_every_part(dry_run):
    code, trained = dry_run
    assert code == 0
    assert set(trained) == {"model_flops", "matmul_flops", "torchtitan_flops", "seconds"}


def test_the_dry_runs_matmul_count_is_torchtitans_with_n_the_matmul_weights(dry_run):
    """6 x 21504 + 12288 = 141312 per token, x 32 tokens; the exact count holds the norms' and
    the elementwise work on top, and torchtitan's the norms' weights as if they multiplied."""
    _, trained = dry_run
    tokens = ROWS * SEQ
    assert trained["matmul_flops"] == (6 * MATMUL_WEIGHTS + ATTENTION_PER_TOKEN) * tokens
    assert trained["torchtitan_flops"] == 142272 * tokens
    assert trained["model_flops"] > trained["matmul_flops"]


def test_without_cuda_it_says_so_and_exits_0(gpu, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 0
    assert capsys.readouterr().out.startswith("no CUDA: skipped")


def test_the_test_part_selects_the_tests_that_need_cuda_and_no_other(gpu):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.gpu", "-p",
               "no:cacheprovider", "--collect-only", "tests/runtime/test_runtime.py",
               "tests/cli/test_cli.py"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    assert "tests/runtime/test_runtime.py::test_cuda_events_time_every_node" in selected
    assert "tests/runtime/test_runtime.py::test_parameters_on_two_devices_are_refused" in selected
    # A test about CUDA's absence runs anywhere: not selected.
    assert not [line for line in selected if "without_it" in line]
    assert all(line.startswith("tests/runtime/") for line in selected)
