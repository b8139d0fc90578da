"""Hugging Face's Trainer with `ExactFlopsTrainer`: a tiny Llama trained 3 steps on CPU, whose
``state.total_flos`` is the sum of `FlopsPerBatch` over the micro-batches the model saw (padded
batches of different lengths, 2 micro-batches per step), whose logs hold each step's FLOPs, its
rate and its MFU over the peak given, and whose matmul count matches torchtitan's formula worked
out by hand."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from exportflops.errors import InputError, MissingExtraError, optional_module  # noqa: E402
from exportflops.training import flops_per_batch  # noqa: E402
from exportflops.training.hf_trainer import ExactFlopsTrainer  # noqa: E402

# A tiny Llama: 2 layers, width 16, 2 query heads of 8 and 1 key/value head, SwiGLU width 32.
LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2, 16, 2, 1, 8, 32, 64
PEAK = 2e12  # FLOP/s, given: the CPU has no datasheet row
STEP_SECONDS = 0.5  # what the fake clock advances between a step's start and its end
BATCH_KEYS = ("input_ids", "attention_mask", "labels")


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def padded(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded to the longest row; padding masked out of attention and of the loss."""
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (longest - len(r["input_ids"])) for r in rows])
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (longest - len(r["input_ids"]))
                         for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def rows_of(lengths: list[int]) -> list[dict]:
    return [{"input_ids": [1 + (i + j) % (VOCAB - 1) for j in range(n)]}
            for i, n in enumerate(lengths)]


def training_args(tmp_path, **overrides) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=0, seed=0, **overrides)


class SeenBatches:
    """The batches the model's forward was called with, kept by a forward pre-hook that is
    removed on exit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.batches = model, []

    def __enter__(self) -> list[dict[str, torch.Tensor]]:
        def keep(module, args, kwargs):
            self.batches.append({k: kwargs[k].clone() for k in BATCH_KEYS})

        self.handle = self.model.register_forward_pre_hook(keep, with_kwargs=True)
        return self.batches

    def __exit__(self, *exc) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def model_and_count():
    model = tiny_llama()
    ids = torch.randint(1, VOCAB, (2, 8))
    # use_cache=False: the example must not return a KV cache (the training step makes none).
    fpb = flops_per_batch(model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                      "labels": ids, "use_cache": False})
    return model, fpb


@pytest.fixture(scope="module")
def padded_run(model_and_count, tmp_path_factory):
    """3 steps of 2 micro-batches of 2 rows, padded per batch, on a clock that advances
    STEP_SECONDS per step."""
    model, fpb = model_and_count
    args = training_args(tmp_path_factory.mktemp("padded"), max_steps=3,
                         gradient_accumulation_steps=2)
    ticks = iter(i * STEP_SECONDS for i in range(1000))
    with pytest.MonkeyPatch.context() as patch, SeenBatches(model) as seen:
        clock = importlib.import_module("exportflops.training.throughput")
        patch.setattr(clock, "perf_counter", lambda: next(ticks))
        trainer = ExactFlopsTrainer(
            model=model, args=args, train_dataset=rows_of([5, 9, 7, 12, 6, 11, 8, 10]),
            data_collator=padded, flops_per_batch=fpb, peak_flop_per_s=PEAK)
        trainer.train()
    return trainer, seen, fpb


def test_total_flos_is_the_sum_over_the_micro_batches_the_model_saw(padded_run):
    trainer, seen, fpb = padded_run
    assert len(seen) == 3 * 2  # max_steps x gradient_accumulation_steps
    # The rows differ in length and padding: the steps' counts differ.
    assert len({fpb(**batch) for batch in seen}) > 1
    assert trainer.state.total_flos == sum(fpb(**batch) for batch in seen)


def test_each_step_logs_its_flops_rate_and_mfu(padded_run):
    """logging_steps=1: each training log is one step, its 2 micro-batches, in STEP_SECONDS."""
    trainer, seen, fpb = padded_run
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3
    for step, entry in enumerate(logs):
        flops = fpb(**seen[2 * step]) + fpb(**seen[2 * step + 1])
        assert entry["window_flops"] == flops
        assert entry["achieved_tflop_per_s"] == pytest.approx(flops / STEP_SECONDS / 1e12,
                                                              rel=1e-12)
        assert entry["mfu"] == pytest.approx(flops / STEP_SECONDS / PEAK, rel=1e-12)


def test_an_epochs_shorter_last_accumulation_is_a_step_of_its_own(model_and_count, tmp_path):
    """3 micro-batches per epoch and 2 per step: the epoch's last step has 1, and is counted
    and timed as one step (the clock advances STEP_SECONDS per step)."""
    model, fpb = model_and_count
    ticks = iter(i * STEP_SECONDS for i in range(1000))
    with pytest.MonkeyPatch.context() as patch, SeenBatches(model) as seen:
        clock = importlib.import_module("exportflops.training.throughput")
        patch.setattr(clock, "perf_counter", lambda: next(ticks))
        trainer = ExactFlopsTrainer(
            model=model, args=training_args(tmp_path, max_steps=3, gradient_accumulation_steps=2),
            train_dataset=rows_of([4, 6, 5, 9, 3, 7]), data_collator=padded,
            flops_per_batch=fpb, peak_flop_per_s=PEAK)
        trainer.train()
    counts = [fpb(**batch) for batch in seen]
    assert len(counts) == 2 + 1 + 2  # epoch 1: a step of 2, a step of 1; epoch 2: a step of 2
    steps = [counts[0] + counts[1], counts[2], counts[3] + counts[4]]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["window_flops"] for entry in logs] == steps
    assert [entry["mfu"] for entry in logs] == pytest.approx(
        [flops / STEP_SECONDS / PEAK for flops in steps], rel=1e-12)
    assert trainer.state.total_flos == sum(counts)


def test_the_closing_summary_has_no_window_to_rate(padded_run):
    trainer, _, _ = padded_run
    summary = trainer.state.log_history[-1]
    assert "train_runtime" in summary and "mfu" not in summary


def test_nothing_is_left_on_the_model(padded_run, model_and_count):
    model, _ = model_and_count
    assert not [name for name in vars(model) if "flops" in name or "clock" in name]
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_matmul_flops_of_unpadded_steps_are_torchtitans_formula(model_and_count, tmp_path):
    """A Trainer counting only the matmul FLOPs (``StepFlops.matmul_flops``), 3 steps of 2 rows
    of 8 tokens, no padding. torchtitan's per-token count (get_num_flop_per_token,
    https://github.com/pytorch/torchtitan, torchtitan/utils.py) is 6 N + 12 L H Q T, N taken as
    the matmul weights (the embedding is a lookup, the norms' weights multiply elementwise):

    1. per layer: q 16x16 + k 16x8 + v 16x8 + o 16x16 + gate, up, down 16x32 each = 2304;
    2. N = 2 layers x 2304 + lm_head 64x16 = 5632;
    3. attention: 12 x 2 layers x 2 heads x 8 head dim x 8 tokens = 3072;
    4. per token 6 x 5632 + 3072 = 36864; a step of 2 x 8 tokens 589824; 3 steps 1769472."""
    model, fpb = model_and_count
    per_layer = (WIDTH * HEADS * HEAD_DIM + 2 * WIDTH * KV_HEADS * HEAD_DIM
                 + HEADS * HEAD_DIM * WIDTH + 3 * WIDTH * FFN)
    assert per_layer == 2304
    n = LAYERS * per_layer + VOCAB * WIDTH
    per_token = 6 * n + 12 * LAYERS * HEADS * HEAD_DIM * 8
    assert per_token == 36864

    def matmul_flops(**batch):
        return fpb.step(**batch).matmul_flops

    trainer = ExactFlopsTrainer(
        model=model, args=training_args(tmp_path, max_steps=3),
        train_dataset=rows_of([8] * 6), data_collator=padded, flops_per_batch=matmul_flops,
        peak_flop_per_s=PEAK)
    trainer.train()
    assert trainer.state.total_flos == 3 * 2 * 8 * per_token == 1_769_472


def test_on_cpu_without_a_peak_the_mfu_is_logged_as_estimated(model_and_count, tmp_path,
                                                              known_cpu):
    """The rule profile() follows: the CPU's estimated peak, its MFU under its own key."""
    model, fpb = model_and_count
    ticks = iter(i * STEP_SECONDS for i in range(1000))
    with pytest.MonkeyPatch.context() as patch, SeenBatches(model) as seen:
        clock = importlib.import_module("exportflops.training.throughput")
        patch.setattr(clock, "perf_counter", lambda: next(ticks))
        trainer = ExactFlopsTrainer(model=model, args=training_args(tmp_path, max_steps=2),
                                    train_dataset=rows_of([4, 6, 5, 7]), data_collator=padded,
                                    flops_per_batch=fpb)
        trainer.train()
    assert (trainer.peak.flop_per_s, trainer.peak.estimated) == (256e9, True)
    assert "estimate, not a datasheet figure" in trainer.peak.source
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["mfu_estimated"] for entry in logs] == pytest.approx(
        [fpb(**batch) / STEP_SECONDS / known_cpu for batch in seen], rel=1e-12)
    assert not any("mfu" in entry for entry in logs)


def test_a_collator_whose_batches_differ_from_the_example_fails_before_the_first_step(
        model_and_count, tmp_path):
    model, fpb = model_and_count

    def without_labels(rows):
        return {key: value for key, value in padded(rows).items() if key != "labels"}

    trainer = ExactFlopsTrainer(model=model, args=training_args(tmp_path, max_steps=1),
                                train_dataset=rows_of([4, 6]), data_collator=without_labels,
                                flops_per_batch=fpb, peak_flop_per_s=PEAK)
    with SeenBatches(model) as seen, pytest.raises(
            InputError, match=r"the Trainer's collator gives batches .*missing labels"):
        trainer.train()
    assert seen == [] and trainer.state.global_step == 0


def test_a_missing_trainer_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # what an absent package reads as
    with pytest.raises(MissingExtraError, match=r"pip install 'exportflops\[trainers\]'"):
        optional_module("lightning.pytorch", needed_by="exportflops.training.lightning",
                        extra="trainers")


def test_the_core_imports_no_trainer_library():
    script = ("import sys, exportflops.training, exportflops.training.throughput, "
              "exportflops.training.composer\n"
              "print(sorted(m for m in ('transformers', 'lightning', 'accelerate') "
              "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
