"""Context parallelism: each rank's share of a causal sequence, its work and its ring traffic.

Torch-free records of `exportflops.parallel.context.analyze_context`; the conventions are in
docs/context-parallel.md.
"""

from __future__ import annotations

from typing import Literal


from .base import SCHEMA_VERSION, NotebookRecord, Record, read_as_rank
from .collectives import Collective


class SequenceChunk(Record):
    """A contiguous run of sequence positions a rank holds: ``start <= position < stop``."""

    index: int
    """The chunk's place in the sequence (0 first): of 2 x cp chunks with load balancing,
    of cp without."""
    start: int
    """Its first position."""
    stop: int
    """One past its last position."""


class RingSend(Record):
    """One kind of message a rank sends around the ring in one attention layer's call: to rank
    ``(rank + 1) % cp``, ``sends`` times, each of ``bytes``."""

    module: str
    """Path of the module whose ``scaled_dot_product_attention`` call the ring replaces."""
    phase: Literal["forward", "backward"]
    """``backward`` for the gradient computation (``mode="train"``)."""
    tensors: Literal["key/value", "key/value gradients"]
    """What the message holds: the key and value shard, or their gradients' accumulators."""
    sends: int
    """Messages of this kind the rank sends in the call."""
    bytes: int
    """Bytes of one message: the key and value shards' elements x the dtype's bytes."""
    dtype: str
    """dtype of the message, e.g. ``float32``."""
    to_rank: int
    """The rank each message goes to (the next on the ring; inside FSDP2 a global rank of the
    sender's own ring)."""
    from_rank: int
    """The rank the same kind of message comes from (the previous on the ring; inside FSDP2 a
    global rank, as ``to_rank``)."""

    @property
    def total_bytes(self) -> int:
        """``sends x bytes``: what the rank sends of this kind in the call."""
        return self.sends * self.bytes

    def collectives(self, cp: int) -> list[Collective]:
        """Each message as a point-to-point `Collective` (op ``send``, mesh dimension ``cp``,
        bandwidth factor 1: the message crosses one link once), for the collectives view."""
        return [Collective(op="send", bytes=self.bytes, dtype=self.dtype, phase=self.phase,
                           group_size=cp, group="cp", mesh_dim="cp", module=self.module,
                           node="", torch_op="ring attention (modeled)", bandwidth_factor=1.0)
                for _ in range(self.sends)]


class ContextRank(Record):
    """One rank's share of the sequence and the work it does on it."""

    rank: int
    """The rank: its index on the context-parallel ring, 0 .. cp - 1; inside FSDP2 or with
    tensor parallelism its global rank, 0 .. fsdp x cp x tp - 1."""
    cp_rank: int
    """Its index on its ring, 0 .. cp - 1: ``rank div tp mod cp`` (torchtitan's mesh: cp,
    then tp innermost), which decides its positions (a record written before FSDP2 composed,
    without this field, reads it as its ``rank``)."""
    chunks: list[SequenceChunk]
    """The sequence positions it holds: chunks ``cp_rank`` and ``2 cp - 1 - cp_rank`` with load
    balancing, chunk ``cp_rank`` without."""

    _cp_rank_of_an_older_record = read_as_rank("cp_rank")
    attention_pairs: int
    """(query, key) pairs its queries attend to under the causal mask (key position <= query
    position), per row of the batch."""
    attention_flops: int
    """FLOPs of its attention: the analysis' FLOPs per (query, key) pair x ``attention_pairs``
    x batch; the forward's, plus the backward's in train mode."""
    attention_macs: int
    """Multiply-accumulates of its attention, as ``attention_flops``."""
    other_flops: int
    """FLOPs of everything else (projections, MLPs, norms, ...): the analysis at this rank's
    sequence length, ``seq / cp``, less the attention there."""
    other_macs: int
    """Multiply-accumulates of everything else, as ``other_flops``."""
    backward_flops: int
    """The part of ``attention_flops + other_flops`` in the backward (0 in forward mode)."""
    sends: list[RingSend]
    """Its ring messages, per attention layer and phase."""

    @property
    def flops(self) -> int:
        """All its FLOPs: attention and the rest."""
        return self.attention_flops + self.other_flops

    @property
    def send_bytes(self) -> int:
        """Bytes it sends around the ring over the step."""
        return sum(s.total_bytes for s in self.sends)


class ContextParallelReport(NotebookRecord):
    """A causal sequence split over ``cp`` ranks that run ring attention: every rank's work and
    its key/value traffic (docs/context-parallel.md)."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record's layout."""
    model: str
    """The analyzed model's class."""
    mode: Literal["forward", "train"]
    """``train``: forward and backward; ``forward``: the forward alone."""
    cp: int
    """Ranks the sequence is split over (one ring)."""
    fsdp: int | None = None
    """The rings inside FSDP2, each of ``cp`` consecutive ranks running its own batch
    (torchtitan's layout: FSDP2 shards the parameters over all ``fsdp x cp`` ranks, its
    ``fsdp`` mesh of ``dp_shard`` and ``cp``); None when context parallelism stands alone."""
    fsdp_collectives: list[Collective] = []
    """FSDP2's all-gathers and reduce-scatters of one rank, in the order it issues them, the
    same sizes on every rank (``mesh_dim`` ``fsdp``: over all ``fsdp x cp`` ranks). Empty
    without ``fsdp``."""
    tp: int | None = None
    """Tensor-parallel ranks at each place of each ring (torchtitan's mesh ``cp``, then ``tp``
    innermost): each runs its tensor-parallel rank of the model on the ring's share of the
    sequence; None without tensor parallelism."""
    tp_collectives: list[Collective] = []
    """The tensor-parallel plan's collectives of one rank on its share of the sequence, in
    the order it issues them, the same sizes on every rank (``mesh_dim`` ``tp``). Empty
    without ``tp``."""
    load_balanced: bool
    """True: round-robin in 2 x cp chunks (torch's ``context_parallel`` for causal attention);
    False: cp contiguous blocks."""
    batch: int
    """Rows of the batch (each rank holds every row's share)."""
    seq_len: int
    """Positions of the whole sequence."""
    attention_layers: int
    """``scaled_dot_product_attention`` calls in the forward: the calls the ring replaces."""
    flops_per_pair: int
    """FLOPs of one (query, key) pair of one row over every attention layer and head (forward,
    plus backward in train mode), from the analysis' terms quadratic in the sequence; with
    ``tp``, over one tensor-parallel rank's heads."""
    macs_per_pair: int
    """Multiply-accumulates of one (query, key) pair, as ``flops_per_pair``."""
    single_device_flops: int
    """The single-device count without the work its causal mask discards
    (``causal_effective_flops``): the FLOPs of one ring's ranks add up to it, plus (cp - 1) x
    the work that does not grow with the sequence, which each rank does."""
    single_device_causal: bool
    """Whether the single-device count saw a causal mask (``masked_flops`` > 0): False where
    the model passes its mask as a tensor, so that ``single_device_flops`` counts every pair
    (the ranks' causal pairs are counted all the same)."""
    ranks: list[ContextRank]
    """Every rank, in rank order: the ``cp`` ranks of the ring, or all ``fsdp x cp x tp``
    ranks (``fsdp`` rings doing the same work, ``tp`` ranks at each place of a ring)."""

    def world_size(self) -> int:
        """The ranks reported: ``fsdp x cp x tp`` (a missing degree counts 1)."""
        return (self.fsdp or 1) * self.cp * (self.tp or 1)

    def cp_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s ring, which split one sequence: ``cp`` ranks ``tp`` apart
        (consecutive without tensor parallelism; torchtitan's mesh, tp innermost)."""
        tp = self.tp or 1
        first = rank - rank // tp % self.cp * tp
        return list(range(first, first + self.cp * tp, tp))

    @property
    def busiest(self) -> ContextRank:
        """The rank with the most FLOPs (the lowest such rank on a tie): it sets the step."""
        return max(self.ranks, key=lambda r: (r.flops, -r.rank))

    @property
    def imbalance(self) -> float:
        """The busiest rank's FLOPs over the ranks' mean: 1.0 when they do equal work."""
        mean = sum(r.flops for r in self.ranks) / len(self.ranks)
        return self.busiest.flops / mean if mean else 1.0

    def collectives(self, rank: int) -> list[Collective]:
        """Everything ``rank`` issues: FSDP2's collectives (inside FSDP2), the tensor-parallel
        plan's, and its ring messages as point-to-point `Collective` records, the forward's
        (FSDP2's first) before the backward's."""
        ring = [c for send in self.ranks[rank].sends for c in send.collectives(self.cp)]
        return sorted([*self.fsdp_collectives, *self.tp_collectives, *ring],
                      key=lambda c: c.phase == "backward")

    def _repr_html_(self) -> str:
        """What Jupyter shows: every rank's positions and work, the busiest rank, and rank 0's
        ring traffic, as the text view's tables (plain HTML, no script)."""
        from ..render.notebook import parallel_html

        return parallel_html(self)
