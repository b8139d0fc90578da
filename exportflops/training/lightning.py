"""Lightning's ``ThroughputMonitor`` with each batch's exact FLOPs and our dense peak.

Lightning's monitor (``lightning/pytorch/callbacks/throughput_monitor.py``, 2.x) reads a
``flops_per_batch`` attribute of the LightningModule after every batch, "assuming that the batch
size is the same during all iterations", and takes the peak from its own device table (matched
by substrings of the device name, ``None`` for a CPU). `ExactThroughputMonitor` is that monitor
with two changes and nothing else:

- after each training batch it hands the monitor the FLOPs of *that* batch, ``flops_fn(batch)``
  (a `FlopsPerBatch` read off the batch's sizes: no export, nothing run), through the one
  attribute the monitor documents reading (``flops_per_batch``) on a small stand-in for the
  module, so nothing is set on the user's module;
- its MFU is over the dense peak of `exportflops.roofline.devices` (`dense_peak`), of the
  Trainer's device unless told: on a CPU that peak is an estimate, and the MFU is logged as
  ``train/device/mfu_estimated`` instead of ``train/device/mfu``.

Lightning computes rates over a window of ``window_size`` batches (default 100; the first
metrics appear once it is full), and logs ``train/device/flops_per_sec`` and
``train/device/mfu`` with ``train/time`` and ``train/batches``. Its time runs from the start of
training, data loading included, CUDA synchronized at each batch's end. Validation and test
batches are counted only with ``eval_flops_fn`` (a forward-only count): the training count
would overstate them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import optional_module
from .throughput import DensePeak, dense_peak

pl = optional_module("lightning.pytorch", needed_by=__name__, extra="trainers")
_monitor = optional_module("lightning.pytorch.callbacks", needed_by=__name__, extra="trainers")
_fabric = optional_module("lightning.fabric.utilities.throughput", needed_by=__name__,
                          extra="trainers")

#: Lightning's precision names (``Trainer(precision=...)``) by their leading part, and the dtype
#: their matmuls run in: ``bf16-mixed``, ``bf16-true``, ``16-mixed``, ``32-true``, ``64-true``.
_PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "32": torch.float32,
                     "64": torch.float64}


@dataclass(frozen=True)
class _BatchFlops:
    """What the monitor reads from the module it is given: the batch's FLOPs."""

    flops_per_batch: int | None


class ExactThroughputMonitor(_monitor.ThroughputMonitor):
    """``ThroughputMonitor`` counting each batch with ``flops_fn(batch) -> int`` (e.g.
    ``lambda batch: fpb(batch[0])`` for a ``(inputs, targets)`` batch and ``fpb =
    exportflops.flops_per_batch(model, ..., mode="train")``), its MFU over a dense peak:
    ``peak_flop_per_s=`` (``False``: no MFU), ``device=`` (a device table key), or the CUDA
    device's row, in ``dtype`` (default: the dtype of the Trainer's ``precision``).
    ``batch_size_fn``, ``length_fn`` and ``**kwargs`` (``window_size``, ``separator``) are
    Lightning's."""

    def __init__(self, flops_fn: Callable[[Any], int], batch_size_fn: Callable[[Any], int],
                 length_fn: Callable[[Any], int] | None = None, *,
                 eval_flops_fn: Callable[[Any], int] | None = None,
                 peak_flop_per_s: float | bool | None = None, device: str | None = None,
                 dtype: str | torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(batch_size_fn=batch_size_fn, length_fn=length_fn, **kwargs)
        self.flops_fn = flops_fn
        self.eval_flops_fn = eval_flops_fn
        self._peak_arguments = {"peak_flop_per_s": peak_flop_per_s, "device": device}
        self._dtype = dtype
        self.peak: DensePeak | None = None
        """The peak the MFU is taken against, resolved at ``setup``."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        arguments = dict(self._peak_arguments)
        if arguments == {"peak_flop_per_s": None, "device": None}:
            arguments["device"] = trainer.strategy.root_device
        self.peak = dense_peak(**arguments,
                               dtype=self._dtype or _precision_dtype(trainer.precision))
        # Lightning's Throughput takes no MFU at all when the peak is falsy (None).
        self.available_flops = self.peak.flop_per_s
        meter = _EstimatedMfu if self.peak.estimated else _fabric.Throughput
        self._throughputs = {
            stage: meter(available_flops=self.peak.flop_per_s, world_size=trainer.world_size,
                         **self.kwargs) for stage in self._throughputs}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, *args: Any) -> None:
        super().on_train_batch_end(trainer, _BatchFlops(self.flops_fn(batch)), outputs, batch,
                                   *args)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        super().on_validation_batch_end(trainer, self._eval_flops(batch), outputs, batch, *args,
                                        **kwargs)

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                          outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        super().on_test_batch_end(trainer, self._eval_flops(batch), outputs, batch, *args,
                                  **kwargs)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        super().on_predict_batch_end(trainer, self._eval_flops(batch), outputs, batch, *args,
                                     **kwargs)

    def _eval_flops(self, batch: Any) -> _BatchFlops:
        return _BatchFlops(None if self.eval_flops_fn is None else self.eval_flops_fn(batch))


class _EstimatedMfu(_fabric.Throughput):
    """Lightning's meter whose MFU, over an estimated peak, is named ``mfu_estimated``."""

    def compute(self) -> dict[str, int | float]:
        metrics = super().compute()
        mfu = f"device{self.separator}mfu"
        if mfu in metrics:
            metrics[f"{mfu}_estimated"] = metrics.pop(mfu)
        return metrics


def _precision_dtype(precision: str) -> torch.dtype:
    dtype = _PRECISION_DTYPES.get(str(precision).split("-")[0])
    if dtype is None:
        raise ValueError(f"Trainer(precision={precision!r}) names no dtype the MFU's peak can be "
                         f"read for: pass ExactThroughputMonitor(dtype=...) (e.g. "
                         f"torch.bfloat16) or peak_flop_per_s=")
    return dtype
