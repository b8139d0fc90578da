"""The FLOPs of one training (or evaluation) step on one batch, read by `flops_per_batch`."""

from __future__ import annotations

from .base import Record


class DocumentFlops(Record):
    """One document of a packed row: the work that is its own."""

    length: int
    """Its tokens."""
    flops: int
    """Its per-token work plus its attention over itself (its length's squared terms):
    what the same step on this document alone counts, less the per-row constant."""


class StepFlops(Record):
    """The FLOPs of one step on one batch, evaluated from the analysis' expressions.

    Three counts answer three questions. ``executed_flops`` is what the graph runs: padding
    included, activation-checkpoint recompute included. ``model_flops`` is what MFU divides
    (PaLM appendix B; Megatron's "model FLOPs"): the useful work only, each row at its own
    length and each packed document attending to itself, without recompute.
    ``hardware_flops`` is ``model_flops`` with the recompute (HFU's numerator)."""

    model_flops: int
    """Useful FLOPs without recompute: MFU's numerator and what ``fpb(batch)`` returns."""
    hardware_flops: int
    """Useful FLOPs with the recompute activation checkpointing adds: HFU's numerator."""
    executed_flops: int
    """FLOPs as the graph runs them on this batch: padded positions and recompute included."""
    recompute_flops: int
    """The part of ``executed_flops`` that activation checkpointing recomputes."""
    forward_flops: int
    """The useful forward's FLOPs (``model_flops`` less the backward's)."""
    matmul_flops: int
    """The part of ``model_flops`` in contractions (matmul, linear, attention, conv): 2 per
    multiply-accumulate, what torchtitan's and PaLM's ``6N + 12LHQT`` formula counts."""
    tokens: int
    """Tokens that are not padding."""
    padded_tokens: int
    """Positions that are padding (0 when no attention mask marks any)."""
    sizes: dict[str, int]
    """The dynamic sizes read off the batch (``batch``, ``seq``, ...), as the graph runs it."""
    documents: list[DocumentFlops] = []
    """Each packed document of a row, when the batch packs documents (``seqlens=``, position
    ids that restart, cumulative sequence lengths); empty otherwise."""
    complete: bool = True
    """False when the analysis left ops uncounted: the counts are then lower bounds."""


class Throughput(Record):
    """One measured span of training (a step, or the steps of a logging window): its FLOPs,
    its time, the rate they make, and that rate over the device's dense peak."""

    flops: int
    """The model FLOPs of the span: what `FlopsPerBatch` counts for its batches (forward and
    backward, padding excluded, no recompute)."""
    seconds: float
    """Wall-clock seconds of the span, CUDA synchronized at both ends (`StepTimer`)."""
    achieved_flop_per_s: float
    """``flops / seconds``."""
    peak_flop_per_s: float | None
    """The dense peak in FLOP/s the MFU is taken against; None when no MFU was asked for
    (``peak_flop_per_s=False``)."""
    mfu: float | None
    """``achieved_flop_per_s / peak_flop_per_s``; None without a peak."""
    device: str
    """The device table's key the peak was read from (``h100-sxm``), or ``user`` for a peak
    given as ``peak_flop_per_s=``, or ``none`` without a peak."""
    dtype: str
    """The table's dtype key of the peak (``bfloat16``, ``tf32``, ...)."""
    peak_source: str
    """Where the peak comes from: ``user``, or the table row with its datasheet."""
