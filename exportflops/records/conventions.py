"""`Conventions`: the training FLOPs each stack would log for one model and batch, beside the
graph's exact count, with the difference split into named terms (`exportflops.conventions`)."""

from __future__ import annotations

from .base import SCHEMA_VERSION, Record


class StackTerm(Record):
    """One part of a stack's count against the same part of the graph's."""

    part: str
    """The part (`exportflops.stacks.parts.PARTS`): ``projections``, ``router``,
    ``experts``, ``norms_and_biases``, ``embedding``, ``output_layer``, ``attention``,
    ``elementwise``, ``backward``, ``recompute`` or ``padding``."""
    theirs_flops: int
    """The stack's FLOPs for this part (0 where its formula has none)."""
    ours_flops: int
    """The graph's FLOPs for this part, forward and backward; for a stack that multiplies
    its forward (DeepSpeed), the forward's, the backward being its own part."""
    difference_flops: int
    """``theirs_flops - ours_flops``: the terms of a stack add up to its difference."""
    reason: str
    """What the part is, and so what a difference in it means."""


class StackCount(Record):
    """What one stack would log for the step, and why it differs from the graph."""

    stack: str
    """The stack, e.g. ``torchtitan``, ``megatron-lm``, ``hf-trainer``."""
    repository: str
    """Where the formula is published: ``owner/name@commit``, a release, or a paper."""
    source: str
    """File and function (or section) of the formula transcribed."""
    covered: bool
    """False when the stack's formula does not handle this model (``reason`` says what the
    stack itself does then); its counts are then None and it has no terms."""
    reason: str = ""
    """Why the stack does not cover the model; empty when it does."""
    flops: int | None
    """The stack's training FLOPs for the step (forward and backward)."""
    tokens: int
    """The tokens the stack counts the step by: B x T, or those of the attention mask."""
    flops_per_token: float | None
    """``flops / tokens``."""
    difference_flops: int | None
    """``flops`` less the graph's count: the sum of ``terms``."""
    terms: list[StackTerm] = []
    """The difference by part; parts where both sides are 0 are left out."""
    mfu: float | None = None
    """The MFU the stack would log for the measured step: ``flops / step_time_s / peak``;
    None without a step time, or when not covered."""


class Conventions(Record):
    """Every stack's training-FLOPs convention for one model and batch, beside the graph."""

    schema_version: int = SCHEMA_VERSION
    """The records' schema version."""
    model: str
    """The report's model."""
    model_type: str
    """The config's ``model_type`` (the key stacks such as verl choose a formula by)."""
    rows: int
    """Rows of the batch, B."""
    seq: int
    """Positions per row, T, padding included."""
    tokens: int
    """Tokens that are not padding."""
    graph_flops: int
    """The exact count: the train-mode report's total (recompute included), or the
    FlopsPerBatch's ``model_flops`` for the batch (padding and recompute excluded)."""
    graph_flops_per_token: float
    """``graph_flops / tokens``."""
    stacks: list[StackCount]
    """Each registered stack, in registry order."""
    step_time_s: float | None = None
    """The measured step time the MFUs are taken for; None when none was given."""
    peak_flop_per_s: float | None = None
    """The dense peak the MFUs divide by."""
    peak_source: str = ""
    """Where the peak comes from: the device table's row and datasheet, or ``user``."""
    graph_mfu: float | None = None
    """The graph's count over the step time and the peak: MFU as exportflops reports it."""

    def stack(self, name: str) -> StackCount:
        for count in self.stacks:
            if count.stack == name:
                return count
        raise KeyError(f"no stack {name!r}; stacks: {[s.stack for s in self.stacks]}")
