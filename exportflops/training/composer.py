"""Composer's ``flops_per_batch(batch)``, from a `FlopsPerBatch`. Composer is not needed here.

Composer's ``SpeedMonitor`` (``composer/callbacks/speed_monitor.py``, at ``batch_end``) calls
``model.flops_per_batch(state.batch)`` when the ComposerModel has that attribute, sums the result
over ranks and divides by the batch's wall-clock time. ``state.batch`` is the batch the
dataloader gave (a dict of the forward's arguments for a ``HuggingFaceModel``; often
``(inputs, targets)`` for others), so the count needs to know which part the forward takes::

    composer_model.flops_per_batch = composer_flops_per_batch(fpb)          # a dict batch
    composer_model.flops_per_batch = composer_flops_per_batch(
        fpb, forward_inputs=lambda batch: batch[0])                         # (inputs, targets)

Setting that attribute is Composer's documented way in, and the user's to make; nothing here
touches the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def composer_flops_per_batch(flops_per_batch: Callable[..., int], *,
                             forward_inputs: Callable[[Any], Any] | None = None
                             ) -> Callable[[Any], int]:
    """``batch -> FLOPs`` as Composer calls it: ``flops_per_batch(**inputs)`` for a mapping
    (a Hugging Face batch), ``flops_per_batch(tensor)`` for one tensor, where ``inputs`` is the
    batch or ``forward_inputs(batch)``. A tuple or list is ambiguous (the forward may take all
    of it, or the inputs without the targets) and needs ``forward_inputs``."""

    def count(batch: Any) -> int:
        inputs = batch if forward_inputs is None else forward_inputs(batch)
        if isinstance(inputs, Mapping):
            return flops_per_batch(**inputs)
        if isinstance(inputs, torch.Tensor):
            return flops_per_batch(inputs)
        if forward_inputs is not None and isinstance(inputs, (tuple, list)):
            return flops_per_batch(*inputs)
        raise TypeError(
            f"composer_flops_per_batch cannot tell the forward's arguments in a "
            f"{type(inputs).__name__} batch: pass forward_inputs=<batch -> the forward's "
            f"arguments>, e.g. forward_inputs=lambda batch: batch[0] for (inputs, targets)")

    return count
