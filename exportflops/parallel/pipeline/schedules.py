"""Pipeline schedules: each rank's order of actions from torch.distributed.pipelining's own
schedule classes, and the step's timeline when each action takes its stage's time.

The order is torch's: a schedule class built on stand-in stages (an autospec of
``PipelineStage``, as torch's ``_schedule_visualizer.get_schedule_ops`` builds it) fills its
``pipeline_order`` {rank: [action or None]}. Only the timing is ours: a rank runs its actions
one after another in that order, each as soon as its input is there (a forward after the stage
before's forward of the same microbatch, a backward after the stage after's backward), which
is what the schedule's blocking receives do. With every action taking one unit this is torch's
``_simulate_comms_compute``; with the roofline's times per stage it is the step's prediction.

The zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
arXiv:2401.10241) split a stage's backward into the input-gradient pass ``I``, which the stage
before waits on, and the weight-gradient pass ``W``, which nothing waits on and which fills
the bubbles: their stages are counted with the backward split the same way
(`exportflops.count.backward.trace_backward`), so each pass takes its own time. torch's
``ScheduleDualPipeV`` (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437,
section 3.2.1, in its V-shaped form) pairs one microbatch's forward with another's backward in
one action (``OVERLAP_F_B``); torch runs the pair's two sub-actions one after the other
(``_PipelineScheduleRuntime._step_microbatches``), so they are two actions here, the paired
forward marked ``P``: torch sends its output to another rank after the whole pair
(``_add_send_recv`` places the pair's sends after it), so a stage on another rank gets it when
the paired backward ends. The pairing overlaps one's communication with the other's
computation, and the timeline has no communication inside a stage to hide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import InputError
from ...records.pipeline import PipelineAction, PipelineRank


@dataclass(frozen=True)
class Schedule:
    """One schedule of the table: the torch class and how many stages a rank runs."""

    torch_class: str
    """The class's name in ``torch.distributed.pipelining``."""
    looped: bool
    """Whether a rank runs several stages (``stages_per_rank`` >= 2), stage s on rank s % p."""
    note: str
    """What it is, for the docs and the refusal that lists the table."""
    split_backward: bool = False
    """Whether a stage's backward runs as two actions, input gradients (``I``) then weight
    gradients (``W``), instead of one (``B``)."""


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("ScheduleGPipe", False,
                      "every microbatch's forward, then every backward (Huang et al. 2019)"),
    # torch 2.13's Schedule1F1B.pipeline_order numbers the last rank's forwards from 1 (its
    # step() does not read it, so training is right; the order is not): the same schedule is
    # ScheduleInterleaved1F1B's generator with one stage per rank.
    "1f1b": Schedule("ScheduleInterleaved1F1B", False,
                     "one forward, one backward in the steady state (PipeDream-Flush, Narayanan "
                     "et al. 2021), from torch's interleaved generator with one stage per rank"),
    "interleaved1f1b": Schedule("ScheduleInterleaved1F1B", True,
                                "1F1B over v stages per rank, depth first (Narayanan et al. "
                                "2021, section 2.2)"),
    "loopedbfs": Schedule("ScheduleLoopedBFS", True,
                          "v stages per rank, each stage's microbatches breadth first"),
    "interleavedzerobubble": Schedule(
        "ScheduleInterleavedZeroBubble", True,
        "interleaved 1F1B with each backward split into input and weight gradients, the "
        "weight passes filling the bubbles (Qi et al. 2023)", split_backward=True),
    "zbvzerobubble": Schedule(
        "ScheduleZBVZeroBubble", True,
        "2 stages per rank placed in a V (rank r holds stages r and 2p-1-r), backward split "
        "into input and weight gradients (Qi et al. 2023, section 6)", split_backward=True),
    "dualpipev": Schedule(
        "ScheduleDualPipeV", True,
        "DeepSeek-V3's DualPipe in a V (2 stages per rank, at least 2p microbatches): one "
        "microbatch's forward paired with another's backward, whole backwards and split ones "
        "(DeepSeek-AI 2024, section 3.2.1)", split_backward=True),
}


def stages_per_rank(name: str) -> int:
    """The stages each rank of schedule ``name`` runs: two for a looped one, as torchtitan's
    default (``pipeline_parallel_layers_per_stage`` unset) and DualPipeV's V, else one."""
    schedule = SCHEDULES.get(name) or _schedule(name, 1)  # the refusal naming the table
    return 2 if schedule.looped else 1


def pipeline_order(name: str, pp: int, microbatches: int,
                   stages_per_rank: int) -> dict[int, list[tuple[int, str, int]]]:
    """{rank: [(stage, action, microbatch), ...]} in torch's order for schedule ``name``, idle
    slots and gradient reductions dropped, paired actions as their two; the action is ``F``,
    ``B``, or with a split backward ``I`` and ``W``."""
    import torch.distributed.pipelining as pipelining
    from unittest import mock

    schedule = _schedule(name, stages_per_rank)
    stand_in = mock.create_autospec(pipelining.PipelineStage, instance=True)
    stand_in.group_rank, stand_in.group_size, stand_in.submod = 0, pp, None
    stand_in.num_stages = pp * stages_per_rank
    cls = getattr(pipelining, schedule.torch_class)
    stages = stand_in if cls.__name__ == "ScheduleGPipe" else [stand_in] * stages_per_rank
    try:
        built = cls(stages, microbatches)
    except (ValueError, AssertionError) as error:  # torch's own condition on p, v and m
        raise InputError(f"schedule {name!r} with {pp} ranks, {stages_per_rank} stages per "
                         f"rank and {microbatches} microbatches: torch's "
                         f"{schedule.torch_class} refuses it: {error} (the microbatches: "
                         f"microbatches=)") from error
    order = {rank: [(a.stage_index, kind, a.microbatch_index)
                    for a, kind in _computations(actions) if kind in "FPBIW"]
             for rank, actions in built.pipeline_order.items()}
    _check_complete(name, order, pp * stages_per_rank, microbatches)
    return order


def _computations(actions: list) -> list[tuple]:
    """(action, its kind) of a rank's actions, idle slots dropped, a paired forward and
    backward (``OVERLAP_F_B``) as its two sub-actions in the order torch runs them, the
    forward's kind ``P``."""
    listed = []
    for a in actions:
        if a is None:
            continue
        if getattr(a, "sub_actions", None):
            listed += [(sub, "P" if sub.computation_type.value == "F" else
                        sub.computation_type.value) for sub in a.sub_actions]
        else:
            listed.append((a, a.computation_type.value))
    return listed


#: The timeline's name for each of torch's computation types (``P``: a paired forward; ``U``
#: and ``R``: a stage's parameter gathering and gradient reduction, ``UNSHARD`` and
#: ``REDUCE_GRAD``, once per step).
ACTION_KINDS = {"F": "forward", "P": "forward", "B": "backward", "I": "backward_input",
                "W": "backward_weight", "U": "unshard", "R": "reduce_grad"}


def with_step_actions(order: dict[int, list[tuple[int, str, int | None]]], microbatches: int,
                      unshard: set[int], reduce: set[int],
                      ) -> dict[int, list[tuple[int, str, int | None]]]:
    """``order`` with the once-per-step actions of data-parallel (FSDP2) stages: the gathering
    of the parameters of the stages of ``unshard``, ``(stage, "U", None)``, first on their
    rank, and the reduction of the gradients of those of ``reduce``, ``(stage, "R", None)``,
    right after each one's last backward or weight pass, where torch's runtime places
    ``UNSHARD`` and ``REDUCE_GRAD`` (``_add_unshard_reshard``, which gathers up to 3 stages
    ahead, and ``_add_reduce_grad`` in torch/distributed/pipelining/schedules.py): each
    microbatch's backward runs with gradient sync and resharding off
    (``backward_maybe_with_nosync``), and the stage reduces once (``perform_reduce_grad``)."""
    placed: dict[int, list[tuple[int, str, int | None]]] = {}
    for rank, actions in order.items():
        held = sorted({stage for stage, _, _ in actions} & unshard)
        placed[rank] = [(stage, "U", None) for stage in held]
        backwards: dict[int, int] = {}
        for stage, kind, mb in actions:
            placed[rank].append((stage, kind, mb))
            if stage in reduce and kind in "BW":
                backwards[stage] = backwards.get(stage, 0) + 1
                if backwards[stage] == microbatches:
                    placed[rank].append((stage, "R", None))
    return placed


def _schedule(name: str, stages_per_rank: int) -> Schedule:
    if name not in SCHEDULES:
        raise InputError(f"no pipeline schedule {name!r}; the schedules: "
                         f"{', '.join(SCHEDULES)} (docs/pipeline.md)")
    schedule = SCHEDULES[name]
    if schedule.looped != (stages_per_rank > 1) or stages_per_rank < 1:
        wants = "2 or more" if schedule.looped else "1"
        raise InputError(f"schedule {name!r} runs {wants} stages per rank, got "
                         f"{stages_per_rank}")
    return schedule


def _check_complete(name: str, order: dict, stages: int, microbatches: int) -> None:
    """Each stage's forward and backward of each microbatch exactly once, the backward whole
    or as its input and weight passes (what torch's ``_validate_schedule`` checks)."""
    listed = sorted((s, "F" if kind == "P" else kind, m)
                    for actions in order.values() for s, kind, m in actions)
    split = {(s, m) for s, kind, m in listed if kind == "I"}
    wanted = sorted((s, kind, m) for s in range(stages) for m in range(microbatches)
                    for kind in ("FIW" if (s, m) in split else "FB"))
    if listed != wanted:
        raise InputError(f"torch's order for schedule {name!r} does not run each stage's "
                         f"forward and backward of each microbatch once; pick another schedule")


def timeline(order: dict[int, list[tuple[int, str, int]]], seconds: Callable[[int, str], float],
             transfer_s: Callable[[int, int, str], float] = lambda src, dst, kind: 0.0,
             senders: dict[int, set[int]] | None = None,
             gradients: dict[int, set[int]] | None = None,
             ) -> tuple[list[PipelineAction], list[PipelineRank], float, float, int]:
    """(actions, ranks, step time, bubble fraction, slowest rank) when rank r runs
    ``order[r]`` in order, a stage's action taking ``seconds(stage, action)`` (a paired
    forward ``P`` as ``F``) and an input crossing from stage ``src`` to ``dst`` taking
    ``transfer_s(src, dst, "F" or "B")`` when the two stages are on different ranks. A stage's
    forward waits on the forwards of ``senders[s]``, the stages it takes a tensor from
    (default: the stage before), a paired forward's reaching another rank when its pair's
    backward ends; its backward (``B``, or its input pass ``I``) on its own forward and the
    backwards (or input passes) of ``gradients[s]``, the stages that send it a gradient
    (default: the stage after); a weight pass ``W`` on its own input pass."""
    rank_of = {s: rank for rank, actions in order.items() for s, _, _ in actions}
    listed = {action for actions in order.values() for action in actions}
    last = max(rank_of)
    if senders is None:
        senders = {s: {s - 1} if s else set() for s in rank_of}
    if gradients is None:
        gradients = {s: {s + 1} if s < last else set() for s in rank_of}
    done: dict[tuple[int, str, int], float] = {}
    # A paired forward's output leaves its rank when the pair ends: (stage, "F", mb) -> then.
    paired = {(s, "F", mb) for actions in order.values() for s, kind, mb in actions
              if kind == "P"}
    sent: dict[tuple[int, str, int], float] = {}
    clock = dict.fromkeys(order, 0.0)
    position = dict.fromkeys(order, 0)
    actions: dict[int, list[PipelineAction]] = {rank: [] for rank in order}
    while any(position[r] < len(order[r]) for r in order):
        moved = False
        for rank in order:
            while position[rank] < len(order[rank]):
                stage, kind, mb = order[rank][position[rank]]
                runs = "F" if kind == "P" else kind  # a paired forward runs as a forward
                ready = _ready(stage, runs, mb, senders, gradients, done, sent, paired,
                               rank_of, transfer_s, listed)
                if ready is None:
                    break
                start = max(clock[rank], ready)
                end = start + seconds(stage, runs)
                before = order[rank][position[rank] - 1] if position[rank] else None
                if before is not None and before[1] == "P":  # the pair ends: its forward leaves
                    sent[(before[0], "F", before[2])] = end
                done[(stage, runs, mb)] = clock[rank] = end
                actions[rank].append(PipelineAction(
                    rank=rank, stage=stage, microbatch=mb, start_s=start, end_s=end,
                    kind=ACTION_KINDS[kind]))
                position[rank] += 1
                moved = True
        if not moved:
            raise InputError("the schedule's order waits on itself (a deadlock): each rank's "
                             "next action needs one that comes later")
    step = max(clock.values())
    busy = {rank: sum(a.end_s - a.start_s for a in actions[rank]) for rank in order}
    ranks = [PipelineRank(rank=rank, stages=sorted({s for s, _, _ in order[rank]}),
                          busy_s=busy[rank], end_s=clock[rank],
                          bubble_fraction=(step - busy[rank]) / step if step else 0.0)
             for rank in sorted(order)]
    bubble = 1 - sum(busy.values()) / (len(order) * step) if step else 0.0
    slowest = min(rank for rank in order if clock[rank] == step)
    return ([a for rank in sorted(order) for a in actions[rank]], ranks, step, bubble, slowest)


def _ready(stage: int, kind: str, mb: int, senders: dict[int, set[int]],
           gradients: dict[int, set[int]], done: dict, sent: dict, paired: set, rank_of: dict,
           transfer_s: Callable[[int, int, str], float], kinds: set) -> float | None:
    """When the action's inputs are there, or None while one is not done yet (a paired
    forward's output, for a stage on another rank, not yet sent)."""
    needs = []  # (action, the stage it comes from)
    if kind == "F":
        needs += [((src, "F", mb), src) for src in sorted(senders[stage])]
    if kind in "BI":
        needs.append(((stage, "F", mb), stage))
        needs += [((dst, "I" if (dst, "I", mb) in kinds else "B", mb), dst)
                  for dst in sorted(gradients[stage])]
    if kind == "W":
        needs.append(((stage, "I", mb), stage))
    # U and R: their rank's order alone
    away = [(action, src) for action, src in needs if rank_of[src] != rank_of[stage]]
    if any(action not in done for action, _ in needs) or any(
            action in paired and action not in sent for action, _ in away):
        return None
    crossing = "F" if kind == "F" else "B"
    return max([sent.get(action, done[action]) + transfer_s(src, stage, crossing)
                if (action, src) in away else done[action] for action, src in needs],
               default=0.0)
