"""A model split into pipeline stages: each stage's work per microbatch, its sends and
receives, and one training step's timeline under a schedule (`exportflops.parallel.pipeline`).

Plain fields only, so the timeline can be drawn from the JSON. Times are seconds predicted by
the roofline on ``device``, measured where the stages ran (``times="measured"``), or with
``device="unit"`` one second per action (every forward and every backward of a stage on a
microbatch: torch's dry-run simulator's step).
"""

from __future__ import annotations

from typing import Literal

from .base import SCHEMA_VERSION, Cost, NotebookRecord, Record, TensorSpec
from .collectives import Collective


class PipelineStage(Record):
    """One stage: the modules it holds and its work on one microbatch."""

    index: int
    """Stage index, 0 for the one that takes the model's inputs."""
    rank: int
    """The pipeline rank that runs it (the schedule's placement: stage ``s`` on rank ``s % p``
    for the looped schedules, in a V for ``zbvzerobubble`` and ``dualpipev``: rank r holds r
    and 2p-1-r)."""
    modules: list[str]
    """Paths of the modules it holds, in the original model's names, cut at the split points'
    depth: the embedding, each layer, the final norm, the head."""
    params: int
    """Parameters it holds."""
    inputs: list[TensorSpec]
    """The tensors it takes per microbatch: the model's inputs for stage 0, else what the stage
    before sends."""
    forward: Cost
    """Work of its forward on one microbatch."""
    backward: Cost
    """Work of its backward on one microbatch (zero in ``mode="forward"``): the gradients of
    its parameters and of the inputs it received that need one. With a schedule that splits the
    backward (zero-bubble, DualPipeV), the work of its two passes (`backward_weight`)."""
    backward_weight: Cost | None = None
    """With a schedule that splits the backward: the part of ``backward`` in its
    weight-gradient pass (torch's ``W``); the rest is its input-gradient pass (``I``), empty
    on a stage whose inputs need no gradient (the first), as torch runs that stage's whole
    backward in ``W``. None otherwise."""
    forward_s: float
    """Time of its forward on one microbatch: the roofline's prediction on the report's
    ``device``, 1 with ``device="unit"``, or the measured median (``times="measured"``)."""
    backward_s: float
    """Time of its backward on one microbatch, as ``forward_s`` (0 in ``mode="forward"``);
    with a schedule that splits the backward, its two passes' together (2 with unit times),
    or where the schedule also runs whole backwards (DualPipeV's ``B``) the stage's backward
    counted (or measured) whole: where one kernel serves both passes (layer norm's backward, a
    wrapper kernel) it runs in each, and once in a whole backward."""
    backward_input_s: float | None = None
    """With a schedule that splits the backward: the time of its input-gradient pass (``I``),
    as ``forward_s``; None otherwise."""
    backward_weight_s: float | None = None
    """With a schedule that splits the backward: the time of its weight-gradient pass
    (``W``)."""
    forward_collectives_s: float = 0.0
    """Time of its own collectives in the forward (``collectives``: tensor-parallel and FSDP2
    ones, not its sends) on the record's link, added to each forward action as if not
    overlapped with compute; 0 without a link or with unit times."""
    backward_collectives_s: float = 0.0
    """Likewise in the backward (the whole backward's, with a schedule that splits it)."""
    backward_input_collectives_s: float = 0.0
    """With a schedule that splits the backward: those of its input-gradient pass (``I``; the
    tensor-parallel reductions of the inputs' gradients)."""
    backward_weight_collectives_s: float = 0.0
    """With a schedule that splits the backward: those of its weight-gradient pass (``W``; a
    replicated weight's gradient all-reduce)."""
    unshard_s: float = 0.0
    """Time of FSDP2's all-gathers of its parameters on the link, once per step before its
    first forward (``UNSHARD``, an ``unshard`` action of the timeline), where they stay
    gathered through the step (in training, when its backward gathers none again); 0
    otherwise, the all-gathers then in ``forward_collectives_s``."""
    reduce_grad_s: float = 0.0
    """Time of FSDP2's reduce-scatters of its gradients on the link, once per step: torch
    turns gradient sync off for each microbatch's backward and reduces after the stage's last
    one (``REDUCE_GRAD``, a ``reduce_grad`` action of the timeline); 0 without FSDP2 or a
    link."""
    sends: list[Collective]
    """What it sends per microbatch: its outputs to the next stage (``forward``), the gradients
    of its inputs to the stage before (``backward``); ``op`` ``send``."""
    receives: list[Collective]
    """What it receives per microbatch, mirroring the peers' sends; ``op`` ``recv``."""
    collectives: list[Collective] = []
    """The tensor-parallel and FSDP collectives one rank of the stage issues per microbatch
    (``tp`` or ``fsdp`` > 1), as the analyzed rank's report lists them; empty otherwise."""
    stands_for: list[int] = []
    """The global ranks that run this stage, on the mesh (pp, fsdp, tp) with tp innermost:
    they differ by their fsdp and tp index only, so they do the same work on the same shapes,
    and the first (fsdp and tp index 0) is the one analyzed, standing for all. The pipeline
    rank alone when ``tp`` and ``fsdp`` are 1; empty in records written before composition."""
    counted_as: int | None = None
    """The stage whose analysis is this one's: itself, or an earlier stage whose call runs the
    same ATen ops on the same shapes, module for module (a middle stage of identical layers),
    whose report this stage takes under its own module paths (its node names are that stage's
    graph's). None in records written before stages were shared."""


class PipelineAction(Record):
    """One action of the step's timeline: a stage's forward or backward (or one pass of it) on a
    microbatch."""

    rank: int
    """The rank that runs it."""
    stage: int
    """The stage it runs."""
    microbatch: int | None
    """The microbatch, 0 to ``microbatches - 1``; None for an ``unshard`` or a
    ``reduce_grad``."""
    kind: Literal["forward", "backward", "backward_input", "backward_weight", "unshard",
                  "reduce_grad"]
    """``forward``; ``backward`` (torch's full backward, ``B``); or with a zero-bubble
    schedule, its input-gradient pass ``backward_input`` (``I``) and weight-gradient pass
    ``backward_weight`` (``W``); with FSDP2 and a link, once per step, ``unshard`` (its
    parameters gathered before its first forward, torch's ``UNSHARD``) and ``reduce_grad``
    (its gradients reduced after its last backward, ``REDUCE_GRAD``)."""
    start_s: float
    """When it starts: once its rank finished the action before it (torch's order) and its
    input arrived (the stage before's forward, the stage after's backward or input pass, plus
    the transfer at ``link_bytes_per_s`` when given; a weight pass after the stage's own input
    pass)."""
    end_s: float
    """``start_s`` plus the stage's ``forward_s``, ``backward_s``, ``backward_input_s`` or
    ``backward_weight_s`` and its collectives' time in that phase, or its ``unshard_s`` or
    ``reduce_grad_s``."""


class PipelineRank(Record):
    """One rank's share of the step."""

    rank: int
    """Pipeline rank."""
    stages: list[int]
    """The stages it runs (more than one for the interleaved and looped schedules)."""
    busy_s: float
    """Sum of its actions' times."""
    end_s: float
    """When its last action ends."""
    bubble_fraction: float
    """Its idle share of the step: ``(step_time_s - busy_s) / step_time_s``."""


class PipelineReport(NotebookRecord):
    """One step of a pipelined model: stages, sends, the schedule's timeline and its bubble."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The model's class, or ``stages`` for stage modules given by the caller."""
    mode: Literal["forward", "train"]
    """``train``: forward and backward actions; ``forward``: the schedule's forward actions
    only, in its order."""
    schedule: str
    """The schedule's name as `exportflops.parallel.pipeline.schedules.SCHEDULES` keys it
    (``1f1b``)."""
    torch_schedule: str
    """The torch.distributed.pipelining class whose action order the timeline follows."""
    microbatches: int
    """Microbatches per step; each stage's counts are for one."""
    pp: int
    """Pipeline ranks."""
    stages_per_rank: int
    """Stages each rank runs (``v``): 1, or more for the interleaved and looped schedules."""
    device: str
    """The roofline's device key the times come from, ``unit`` (one second per action), or
    where the stages ran when measured (``cpu (16 threads, AVX512)``, a GPU's name)."""
    times: Literal["roofline", "unit", "measured"] = "roofline"
    """Where each action's time comes from: the roofline's prediction of the stage's nodes on
    ``device``, one unit per action, or the stage run for real on ``device``."""
    timer: str = ""
    """How measured times were taken (clock, iterations, the backward's seeds); empty
    otherwise."""
    tp: int = 1
    """Tensor-parallel degree inside each stage (the innermost mesh dimension); 1: none."""
    fsdp: int = 1
    """FSDP degree inside each stage (the mesh dimension between pp and tp); 1: none."""
    link_bytes_per_s: float | None = None
    """Bandwidth of the link between ranks, when the timeline delays each received tensor by
    ``bytes / link_bytes_per_s`` and a stage's own collectives by their time on it
    (`Collective.seconds`); None: transfers and collectives take no time."""
    stages: list[PipelineStage]
    """Every stage, in order."""
    timeline: list[PipelineAction]
    """Every action of the step, by rank and in each rank's order."""
    ranks: list[PipelineRank]
    """Every rank's busy time, end and bubble."""
    step_time_s: float
    """When the last action of the step ends."""
    bubble_fraction: float
    """Idle share of all ranks' time in the step: ``1 - sum(busy_s) / (pp * step_time_s)``."""
    slowest_rank: int
    """The rank whose last action ends the step (the lowest such rank)."""

    def world_size(self) -> int:
        """Ranks in all: ``pp * fsdp * tp``."""
        return self.pp * self.fsdp * self.tp

    def sends(self) -> list[Collective]:
        """Every stage's sends, stage by stage."""
        return [send for stage in self.stages for send in stage.sends]

    def _repr_html_(self) -> str:
        """What Jupyter shows: its stages, its ranks' busy time and bubble, and the step's
        line, as the text view's tables (plain HTML, no script)."""
        from ..render.notebook import parallel_html

        return parallel_html(self)
