"""Expert parallelism per rank: each rank's expert work, the rest of its work, and the
all-to-alls that move its tokens to the experts and back (`exportflops.parallel.experts`)."""

from __future__ import annotations

from typing import Literal


from .base import SCHEMA_VERSION, Cost, NotebookRecord, Record, read_as_rank
from .collectives import Collective


class ExpertRank(Record):
    """One rank of the expert-parallel group: its experts, the token copies routed to them, its
    work split into the experts' and the rest, and the all-to-alls it issues."""

    rank: int
    """The rank: 0 .. ep - 1, or inside FSDP2 one of the fsdp data-parallel ranks 0 .. fsdp - 1
    (with ``tp``, of the fsdp x tp ranks)."""
    ep_rank: int
    """Its index in its expert-parallel group: ``rank mod ep`` (ep innermost, torchtitan's
    mesh), the rank itself when expert parallelism stands alone (a record written before
    FSDP2 composed, without this field, reads it as its ``rank``)."""

    _ep_rank_of_an_older_record = read_as_rank("ep_rank")
    first_expert: int
    """The first expert this rank holds: experts ``first_expert .. last_expert`` are its own,
    ``ep_rank x E / ep`` to ``(ep_rank + 1) x E / ep - 1`` as torchtitan shards them (dim 0)."""
    last_expert: int
    """The last expert this rank holds (inclusive)."""
    routed_tokens: int
    """Token copies its experts compute in each MoE layer: the routing histogram summed over
    its experts, gathered from every rank's batch."""
    expert: Cost
    """Its experts' work over every MoE layer: the single batch's expert work per routed token
    times ``routed_tokens`` (forward and, in train mode, backward)."""
    rest: Cost
    """The work outside the experts on its own batch (attention, router, norms, shared
    experts, head): one batch's analysis less its experts', the same on every rank; with
    ``tp``, its tensor-parallel rank's analysis less its experts'."""
    all_to_alls: list[Collective]
    """The dispatch and combine all-to-alls it issues, per MoE layer and phase, in execution
    order (the backward's in reverse)."""

    @property
    def total(self) -> Cost:
        """Everything the rank computes: ``expert + rest``."""
        return self.expert + self.rest


class ExpertParallelReport(NotebookRecord):
    """A mixture of experts with its experts sharded over ``ep`` ranks, each rank running its
    own batch (expert parallelism inside data parallelism, torchtitan's layout), optionally
    inside ``fsdp`` FSDP2 ranks: every rank's work, all-to-alls and FSDP2 collectives, and the
    busiest rank."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The analyzed model's class."""
    mode: Literal["forward", "train"]
    """``train`` when the backward (and its two all-to-alls per MoE layer) is counted too."""
    ep: int
    """Ranks the experts are sharded over (one expert-parallel group)."""
    fsdp: int | None = None
    """The FSDP2 data-parallel ranks the expert-parallel groups sit inside (ep inside fsdp,
    torchtitan's layout: ``fsdp / ep`` groups of ``ep`` consecutive ranks); None when expert
    parallelism stands alone."""
    tp: int | None = None
    """The tensor-parallel ranks the expert-parallel groups are laid over (torchtitan's sparse
    mesh spans fsdp x tp, ep innermost; ``tp == ep`` without ``fsdp``): each rank runs its
    tensor-parallel share of the dense layers by the model's own plan and routes ``1 / tp`` of
    its batch's tokens; None without tensor parallelism."""
    tp_collectives: list[Collective] = []
    """The tensor-parallel rank's collectives, in the order it issues them, the same sizes on
    every rank: the model's plan's and the MoE's (the routed output's all-reduce, the router's
    and the experts' input gradients' all-gathers, ``mesh_dim`` ``tp``). Empty without ``tp``."""
    fsdp_collectives: list[Collective] = []
    """FSDP2's all-gathers and reduce-scatters of one rank, in the order it issues them, the same
    sizes on every rank: ``mesh_dim`` ``fsdp`` for the non-expert parameters (over all ``fsdp``
    ranks, or with ``tp`` those of the rank's tp index: `fsdp_group`), ``efsdp`` for the rank's
    experts (over the ``fsdp / ep`` ranks holding the same experts, ``fsdp x tp / ep`` with
    ``tp``: `efsdp_group`). Empty without ``fsdp``."""
    num_experts: int
    """Experts per MoE layer (E)."""
    top_k: int
    """Experts each token is routed to."""
    tokens: int
    """Tokens each rank routes per MoE layer, each to ``top_k`` experts: its batch's (the
    example's), or with ``tp`` its ``1 / tp`` share of the batch's."""
    hidden: int
    """Hidden size of a routed token: the all-to-alls carry ``hidden`` values per token copy."""
    dtype: str
    """dtype of the tokens the all-to-alls carry (the experts' parameters'), e.g. ``float32``."""
    layers: list[str]
    """Path of each MoE layer's experts module, in the model's order."""
    routing: list[int]
    """Token copies per expert, summed over the batches of one expert-parallel group's ranks
    (sums to ``ep x tokens x top_k``; the same in every group): the one given, or the balanced
    one."""
    balanced: bool
    """True when no histogram was given: each expert gets ``ep x tokens x top_k / E``."""
    single_device: Cost
    """One batch on one device: the analysis of the example, every expert included (with
    ``tp``, the work its ``tp`` ranks share)."""
    ranks: list[ExpertRank]
    """Each rank, in rank order: the ``ep`` ranks of the group, or inside FSDP2 all `world_size`
    ranks."""
    busiest_rank: int
    """The rank with the most FLOPs (the lowest such rank on a tie): its time sets the step."""
    complete: bool = True
    """False when the analysis left ops uncounted: the counts are then lower bounds."""

    def world_size(self) -> int:
        """The ranks reported: ``fsdp`` inside FSDP2, else ``ep``; with ``tp``, ``fsdp x tp``
        (or ``tp``, equal to ``ep``, without FSDP2): every rank is listed
        (`exportflops.parallel.Layout` lays them out)."""
        return len(self.ranks)

    def fsdp_group(self, rank: int) -> list[int]:
        """The ranks FSDP2 shards the non-expert parameters over with ``rank``: all of them, or
        with ``tp`` those of its tensor-parallel index (tp innermost, torchtitan's mesh)."""
        step = self.tp or 1
        return list(range(rank % step, self.world_size(), step))

    def ep_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s expert-parallel group, which exchange tokens: ``ep``
        consecutive ranks (ep innermost in torchtitan's sparse mesh)."""
        first = rank - rank % self.ep
        return list(range(first, first + self.ep))

    def efsdp_group(self, rank: int) -> list[int]:
        """The ranks holding the same experts as ``rank``, over which FSDP2 shards them: every
        ``ep``-th rank from ``rank mod ep`` (just ``rank`` without ``fsdp``)."""
        return list(range(rank % self.ep, self.world_size(), self.ep))

    def collectives(self, rank: int) -> list[Collective]:
        """Everything ``rank`` issues: FSDP2's collectives, the tensor-parallel rank's and its
        all-to-alls, the forward's (FSDP2's first) before the backward's."""
        ordered = [*self.fsdp_collectives, *self.tp_collectives, *self.ranks[rank].all_to_alls]
        return sorted(ordered, key=lambda c: c.phase == "backward")

    def _repr_html_(self) -> str:
        """What Jupyter shows: every rank's routed tokens and work, the busiest rank, and rank
        0's all-to-alls, as the text view's tables (plain HTML, no script)."""
        from ..render.notebook import parallel_html

        return parallel_html(self)
