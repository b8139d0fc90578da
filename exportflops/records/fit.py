"""A checkpointing plan that fits a training step into a memory budget (`exportflops.fit`).
Imports no torch. Definitions: docs/fit.md."""

from __future__ import annotations

from typing import Any

from .base import SCHEMA_VERSION, Record
from .memory import KindBytes


class FitCandidate(Record):
    """One plan the planner measured: the first ``blocks`` blocks checkpointed, whole or
    selectively."""

    blocks: int
    """How many blocks, in the order the model runs them, are checkpointed."""
    selective: bool = False
    """Whether they are checkpointed selectively (non-reentrant, the matrix products' and
    attention's outputs kept: `exportflops.checkpointing.save_matmuls`); else whole."""
    peak_bytes: int
    """The step's peak with them checkpointed (`exportflops.memory`)."""
    recompute_flops: int
    """The FLOPs their recompute adds to the step (`exportflops.analyze`, mode="train")."""
    recompute_time_s: float | None
    """The recompute's roofline time on ``device_model``; None without a device."""


class FitPlan(Record):
    """The cheapest checkpointing plan whose predicted peak is at most the budget, and the largest
    batch and sequence length that fit with and without it. ``apply(model)`` wraps the chosen
    blocks."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The planned model's class."""
    optimizer: str
    """The training step's optimizer (``adamw``, ``adam``, ``sgd``)."""
    budget_bytes: int
    """The budget the peak must stay under."""
    budget: str
    """The budget as given (``80GiB``, ``h100-sxm`` less its headroom, or bytes)."""
    device_model: str = ""
    """The device whose roofs time the recompute; ``""``: FLOPs decide."""
    layout: str = ""
    """The parallel layout planned per rank (``Layout(fsdp=2)``): every peak is then the
    highest rank's, the sizes a rank's; ``""``: one device."""
    peak_rank: int | None = None
    """With a ``layout``, the rank whose peak is ``peak_bytes`` (the first of equal peaks);
    None on one device."""
    blocks: list[str]
    """Every candidate block's path, in the order the model runs them."""
    checkpointed: list[str]
    """The blocks the plan checkpoints whole (the first ``len(checkpointed)`` of ``blocks``)."""
    selective: list[str] = []
    """The blocks the plan checkpoints selectively (the first ``len(selective)`` of
    ``blocks``; a plan has these or ``checkpointed``, not both)."""
    peak_bytes: int
    """The step's predicted peak with the plan applied."""
    by_kind: KindBytes
    """What holds that peak, by kind."""
    recompute_flops: int
    """The FLOPs the plan's recompute adds to a training step."""
    recompute_time_s: float | None
    """Their roofline time on ``device_model``; None without a device."""
    candidates: list[FitCandidate]
    """Every plan measured: none to all blocks checkpointed whole, then one to all
    selectively."""
    example_batch: int
    """The batch (rows of the example inputs) the plan was measured at."""
    largest_batch: int | None = None
    """The most rows whose step fits the budget with the plan applied (0: not one; None: not
    searched, the inputs hold no tensor), from the step's memory at symbolic sizes, or with a
    ``resize`` given, steps at each batch."""
    largest_batch_without_plan: int | None = None
    """The same without checkpointing."""
    example_length: int = 0
    """The sequence length (dim 1 of the example's token ids) the plan was measured at; 0:
    the first input is no token ids."""
    largest_length: int | None = None
    """The longest sequence, at the example's batch, whose step fits the budget with the plan
    applied (0: not one of 1 token; None: not searched, no token ids or a ``resize`` given),
    from the step's memory at symbolic sizes (docs/fit.md)."""
    largest_length_without_plan: int | None = None
    """The same without checkpointing."""

    def apply(self, model: Any) -> Any:
        """Wraps each of ``checkpointed`` in ``model`` in place in torch's reentrant
        ``checkpoint_wrapper``, each of ``selective`` in a non-reentrant one with the selective
        policy (`exportflops.checkpointing.save_matmuls` through
        ``create_selective_checkpoint_contexts``), and returns ``model``; an `InputError` when a
        path is missing or is already wrapped (a plan applies once). docs/fit.md."""
        # Imported here: records import no torch.
        from ..checkpointing import wrap_blocks

        return wrap_blocks(model, self.checkpointed, name=self.model, selective=self.selective)
