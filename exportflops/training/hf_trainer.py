"""Hugging Face's ``Trainer`` with exact FLOPs: ``state.total_flos`` counted per batch, and
``mfu`` and the achieved TFLOP/s logged at each logging step.

How the Trainer counts (transformers 5.x, ``trainer.py``): after each micro-batch's
``training_step`` it adds ``float(self.floating_point_ops(inputs))`` to ``current_flos``, which
``store_flos`` moves into ``state.total_flos`` (summed over processes); the default estimate is
``6 x input_ids.numel() x non-embedding parameters``. Its docstring asks a model that needs more
to "subclass and override this method", which `ExactFlopsMixin` does: each micro-batch is
counted by `FlopsPerBatch` from its tensors' sizes (no export, nothing run), so gradient
accumulation is counted micro-batch by micro-batch as the Trainer calls it.

Before the first step (``on_train_begin``) the collator's batch of the dataset's first example
is counted once, so that a collator whose batches differ from the analyzed example (a missing
``labels``, float ids) fails before the run rather than at its first micro-batch.

The same mixin times each optimizer step with a callback (``on_step_begin`` at the first
micro-batch, ``on_step_end`` after the optimizer; CUDA synchronized at both) and, in
``Trainer.log``, adds to a training log the window since the previous one: ``window_flops``,
``achieved_tflop_per_s`` and ``mfu`` (``mfu_estimated`` where the peak is the CPU's estimate,
`exportflops.roofline.devices.device_peak`). It adds them in ``log`` rather than a callback's
``on_log`` because ``log`` appends to ``state.log_history`` and hands the same dict to every
reporting callback (TensorBoard, W&B); an ``on_log`` that edits it runs after them.

Nothing is patched: no transformers class is changed and nothing is set on the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import InputError, optional_module
from .throughput import DensePeak, StepTimer, dense_peak

transformers = optional_module("transformers", needed_by=__name__, extra="trainers")


class StepClock(transformers.TrainerCallback):
    """Seconds of each optimizer step (its micro-batches' forward and backward, the clipping
    and the optimizer), summed over a logging window. Data loading before the step, logging,
    evaluation and checkpoints between steps are not counted."""

    def __init__(self) -> None:
        self._timer = StepTimer()
        self.seconds = 0.0
        """Seconds of the steps timed since the window was last taken."""
        self.steps = 0
        """Steps timed since the window was last taken."""

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        # The Trainer calls it at each accumulation's first micro-batch, after the batches
        # were fetched (``get_batch_samples``), and ``on_step_end`` after the optimizer.
        self._timer.start()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.seconds += self._timer.stop()
        self.steps += 1

    def take(self) -> tuple[int, float]:
        """The window's steps and seconds, and a new empty window."""
        window = self.steps, self.seconds
        self.steps, self.seconds = 0, 0.0
        return window


class FirstBatchCheck(transformers.TrainerCallback):
    """Counts the collator's batch of the dataset's first example at ``on_train_begin``: the
    batch checks of ``flops_per_batch`` (its arguments, dtypes, ranks, mask) run before the
    first step. The collator runs under a forked RNG, so a random collator (masked language
    modelling) draws nothing from the run's stream."""

    def __init__(self, flops_per_batch: Callable[..., int]) -> None:
        self.flops_per_batch = flops_per_batch

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs) -> None:
        dataset = getattr(train_dataloader, "dataset", None)
        collate = getattr(train_dataloader, "collate_fn", None)
        if collate is None or not hasattr(dataset, "__getitem__"):
            return  # an iterable dataset: its first batch is the run's own
        with torch.random.fork_rng(devices=[]):
            batch = collate([dataset[0]])
        try:
            self.flops_per_batch(**batch)
        except InputError as error:
            raise InputError(
                f"the Trainer's collator gives batches flops_per_batch cannot count (checked "
                f"on the dataset's first example, before the first step): {error} Make the "
                f"collator give the batches the analyzed example had, or analyze one of its "
                f"batches: flops_per_batch(model, (), batch).") from None


class ExactFlopsMixin:
    """Put before a ``Trainer`` class (``class MyTrainer(ExactFlopsMixin, SFTTrainer)``) to
    count each micro-batch with ``flops_per_batch`` and log MFU; `ExactFlopsTrainer` is the
    mixin on ``transformers.Trainer``.

    ``flops_per_batch`` is a `FlopsPerBatch` (``exportflops.flops_per_batch(model, ...,
    mode="train")``) or any callable taking a batch's tensors as the model's forward does,
    ``flops_per_batch(**inputs) -> int``. Analyze it with the inputs the Trainer passes (with
    ``labels`` when the model computes its loss) so that the loss is counted too.

    The peak: ``peak_flop_per_s=`` (``False``: no ``mfu``), ``device=`` (a key of the device
    table), or the peak of the Trainer's device (``args.device``: a CUDA device's row, the
    CPU's estimate, logged as ``mfu_estimated``); ``dtype`` defaults to ``bfloat16`` with
    ``args.bf16``, ``float16`` with ``args.fp16``, else the model's parameters' dtype.
    """

    def __init__(self, *args: Any, flops_per_batch: Callable[..., int],
                 peak_flop_per_s: float | bool | None = None, device: str | None = None,
                 dtype: str | torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flops_per_batch = flops_per_batch
        if device is None and peak_flop_per_s is None:
            device = self.args.device  # the device the Trainer runs on
        self.peak: DensePeak = dense_peak(peak_flop_per_s=peak_flop_per_s, device=device,
                                          dtype=dtype or _training_dtype(self))
        self.step_clock = StepClock()
        self._window_flops = 0
        self.add_callback(FirstBatchCheck(flops_per_batch))
        self.add_callback(self.step_clock)

    def floating_point_ops(self, inputs: Mapping[str, Any]) -> int:
        """The micro-batch's model FLOPs, forward and backward, read off its tensors' sizes."""
        flops = self.flops_per_batch(**inputs)
        self._window_flops += flops
        return flops

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's log, with the window's FLOPs, achieved TFLOP/s and MFU added when
        steps were timed since the previous log (evaluation logs have none)."""
        steps, seconds = self.step_clock.take()
        if steps:
            rate = self.peak.throughput(self._window_flops, seconds)
            logs = {**logs, "window_flops": rate.flops,
                    "achieved_tflop_per_s": rate.achieved_flop_per_s / 1e12}
            if rate.mfu is not None:
                logs["mfu_estimated" if self.peak.estimated else "mfu"] = rate.mfu
            self._window_flops = 0
        super().log(logs, *args, **kwargs)


class ExactFlopsTrainer(ExactFlopsMixin, transformers.Trainer):
    """``transformers.Trainer`` whose ``total_flos`` is exact and whose logs hold ``mfu``:
    ``ExactFlopsTrainer(model=..., args=..., train_dataset=..., flops_per_batch=fpb,
    peak_flop_per_s=...)``. See `ExactFlopsMixin`."""


def _training_dtype(trainer: Any) -> torch.dtype:
    if trainer.args.bf16:
        return torch.bfloat16
    if trainer.args.fp16:
        return torch.float16
    return next(trainer.model.parameters()).dtype
