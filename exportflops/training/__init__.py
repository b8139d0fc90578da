"""Training steps: each batch's exact FLOPs, and where trainers ask for them.

`per_batch.flops_per_batch` analyzes a model once, symbolic in the batch and sequence sizes,
and returns a function of a batch (`terms` splits the counts by how they scale, `batches`
reads padding and packed documents off a batch). `throughput` turns a step's FLOPs and time
into achieved FLOP/s and MFU against the device table's dense peak. The trainers' hooks
(`hf_trainer`, `lightning`, `composer`) import their library on first use: the names below
that need one load lazily (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

from .composer import composer_flops_per_batch
from .per_batch import FlopsPerBatch, flops_per_batch
from .throughput import DensePeak, StepTimer, dense_peak, throughput_of

#: Names whose module imports transformers or lightning, loaded on first use.
_LAZY = {"ExactFlopsTrainer": "hf_trainer", "ExactFlopsMixin": "hf_trainer",
         "ExactThroughputMonitor": "lightning"}

__all__ = ["DensePeak", "FlopsPerBatch", "StepTimer", "composer_flops_per_batch", "dense_peak",
           "flops_per_batch", "throughput_of", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
