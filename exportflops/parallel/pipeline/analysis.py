"""Pipeline parallelism: a model split into stages as torch.distributed.pipelining splits it,
each stage counted on one microbatch, its sends and receives, and one step's timeline under a
schedule of torch's (`exportflops.parallel.pipeline.schedules`).

How a stage is counted: its module (a ``GraphModule`` torch's ``pipeline()`` cut at the split
points, or one the caller built) goes through `exportflops.analyze` on the tensors it receives,
made by running the stages before it on the caller's inputs (on meta, nothing is computed). In
``mode="train"`` a received tensor needs a gradient where the stage before's output does (the
hidden state does, the rotary tables do not), so a stage's backward holds the gradients it
sends back, and the stages' counts add up to the whole model's. Gradients flow from the last
stage's outputs as from the whole model's (`exportflops.count.backward`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import torch

from ...aggregate import Counted, build_report, with_paths
from ...api import count_call
from ...capture.blocks import call_key
from ...capture.pipeline_split import Stage, as_received, split_stages
from ...errors import InputError
from ...records import Collective, Report, TensorSpec
from ...records.collectives import check_link
from ...records.pipeline import PipelineReport, PipelineStage
from .schedules import SCHEDULES, pipeline_order, timeline, with_step_actions
from .stage_times import action_times, collective_seconds

#: Predicted times with this device when none is named (the roofline's table key).
DEFAULT_DEVICE = "h100-sxm"
#: The stages torch's pipelining keeps gathered on a rank (``max_active_stages`` of
#: ``_add_unshard_reshard`` in torch/distributed/pipelining/schedules.py): a rank holding more
#: reshards and gathers again within a step.
ACTIVE_STAGES = 3


class PipelineAnalysis(NamedTuple):
    """`analyze_pipeline`'s result (and `count_pipeline`'s): the step's record, and each stage's
    full report and the count it is built from."""

    record: PipelineReport
    stage_reports: list[Report]
    """Stage s's report, its representative's on the mesh: ``world_size`` the ranks,
    ``rank`` its (fsdp, tp index 0), ``collectives`` its own and its sends and receives (the
    collectives view lists them), their peers the representatives of the other stages."""
    stage_counts: list[Counted]
    """What each of ``stage_reports`` is built from (`build_report`), for the report of
    another rank of the stage (`exportflops.parallel.pipeline.mesh.rank_report`)."""


def count_pipeline(model: torch.nn.Module | None, args: Any = (), kwargs: dict | None = None,
                   *, stages: int | Sequence[str] | Sequence[torch.nn.Module],
                   schedule: str = "1f1b", microbatches: int | None = None,
                   stages_per_rank: int | None = None,
                   mode: Literal["forward", "train"] = "train",
                   device: str | None = DEFAULT_DEVICE,
                   link_bytes_per_s: float | None = None, strict: bool = False,
                   count_stage: Callable[[int, int, Stage], Counted] | None = None,
                   count_whole: Callable[[int, int, Stage], Counted] | None = None,
                   measure: bool = False, warmup: int = 3, repeat: int = 10,
                   share_alike: bool | None = None, fsdp: int = 1, tp: int = 1,
                   ) -> PipelineAnalysis:
    """The engine of `exportflops.parallel.pipeline.analyze_pipeline` (the public call, which
    takes a `Layout` for stages on tp/fsdp ranks): split ``model`` into pipeline stages, count
    each on one microbatch ``model(*args, **kwargs)``, and lay out one step of ``microbatches``
    (default: as many as ranks) under ``schedule`` (a key of `SCHEDULES`).

    ``stages``: a count (the model's layers split evenly, `layer_split_points`), the module
    paths to split before (torch's ``SplitPoint.BEGINNING``), the stage modules themselves
    (``model`` None; each takes what the one before returns), or `Stage`s with what each
    receives (`llama_stages`). A stage whose call is alike an earlier one's is counted once
    (`PipelineStage.counted_as`). ``stages_per_rank``: ``v`` for
    the looped schedules (default 2), stage s on rank s % (stages / v). ``device``: the
    roofline's device for each action's time, or None for one unit per action.
    ``count_stage(stage index, pipeline rank, stage)``: the stage's count (`Counted`), when it
    is counted another way than ``count_call(stage.module, ...)`` (`analyze_pipeline_ranks`
    passes one that counts a tensor-parallel/FSDP2 rank of it); its collectives stay in the
    stage's report. ``fsdp``, ``tp``: each stage runs on ``fsdp x tp`` ranks of the mesh
    (pp, fsdp, tp), its count standing for its group (the record names the ranks it stands
    for; its report is its rank's of fsdp and tp index 0, the world and peers in global
    ranks).
    Under a schedule splitting the backward its reports are counted with ``split_backward``
    (but stage 0's, which torch runs whole), and ``count_whole``, taking the same arguments,
    counts a stage with its backward whole for the whole backwards DualPipeV also runs
    (without it, such a backward takes its two passes' time).
    ``share_alike``: a stage alike an earlier one takes its report, not counted again (default:
    only when ``count_stage`` is None; a ``count_stage`` whose report depends on the stage's
    call alone, not on its index or rank, may ask for it). ``measure``: each action's time is
    measured instead, each stage run for real where the model and inputs are (cpu or cuda) on
    what it receives, median of ``repeat`` runs after
    ``warmup`` (`exportflops.runtime.call_times`).
    """
    if measure and (count_stage is not None or device not in (None, DEFAULT_DEVICE)):
        raise InputError("measure=True times each stage where the model runs: it takes no "
                         "roofline device and no layout of tp or fsdp ranks (stages counted "
                         "on fake ranks have nothing to run)")
    if measure:  # before the stages are counted
        from ...runtime.measure import check_iterations
        check_iterations(warmup, repeat, "analyze_pipeline(measure=True)")
    if link_bytes_per_s is not None:
        check_link(link_bytes_per_s)
    split, depth = _stages(model, args, kwargs, stages, mode)
    looped = _looped(schedule)
    v = (stages_per_rank or 2) if looped else (stages_per_rank or 1)
    if len(split) % v:
        raise InputError(f"{len(split)} stages do not go {v} to a rank: give a multiple of "
                         f"stages_per_rank={v}")
    pp = len(split) // v
    m = pp if microbatches is None else microbatches
    if m < 1:
        raise InputError(f"microbatches={m}: a step runs at least one")
    order = pipeline_order(schedule, pp, m, v)
    if mode == "forward":  # the schedule's forwards, in its order, none paired
        order = {rank: [(s, "F", mb) for s, kind, mb in actions if kind in "FP"]
                 for rank, actions in order.items()}
    rank_of = {s: rank for rank, actions in order.items() for s, _, _ in actions}

    two_passes = SCHEDULES[schedule].split_backward and mode == "train"
    # DualPipeV also runs whole backwards: then each stage is counted whole as well, when it
    # is counted here.
    whole_too = two_passes and (count_stage is None or count_whole is not None) and any(
        kind == "B" for actions in order.values() for _, kind, _ in actions)
    share_alike = count_stage is None if share_alike is None else share_alike

    def analyzed(stage: Stage, split_backward: bool) -> Counted:
        return count_call(stage.module, stage.args, stage.kwargs, mode=mode, strict=strict,
                          split_backward=split_backward)

    if count_stage is None:
        def count_stage(s: int, rank: int, stage: Stage) -> Counted:
            # torch runs the first stage's backward whole, in its weight pass.
            return analyzed(stage, two_passes and s > 0)
    staged, counted_as = _counted(split, rank_of, count_stage, grad=mode == "train",
                                  share=share_alike, first_apart=two_passes)
    if two_passes:
        staged[0] = _in_weight_pass(staged[0])
    width = fsdp * tp
    sends, receives = _transfers(split, rank_of, mode, width)
    # Each stage's report, built once: its own collectives, then its sends and receives.
    counts = [dataclasses.replace(c, world_size=pp * width, rank=rank_of[s] * width,
                                  collectives=[*c.collectives, *sends[s], *receives[s]])
              for s, c in enumerate(staged)]
    reports = [build_report(c) for c in counts]
    if two_passes:
        _check_split(reports, staged, schedule, link_bytes_per_s)
    if measure:
        where, timer, times = _measured(model, split, args, kwargs, mode, warmup, repeat,
                                        two_passes, whole_too)
    else:
        where, timer = device or "unit", ""
        wholes = [None] * len(split)
        if whole_too and device:
            wholes = [build_report(c) for c in _counted(split, rank_of, count_whole or (
                lambda s, rank, stage: analyzed(stage, False)), grad=True, share=share_alike)[0]]
        times = [action_times(report, device, two_passes, whole)
                 for report, whole in zip(reports, wholes)]
    # A stage's own collectives (its tensor-parallel and FSDP2 ones), timed on the link when
    # the times are seconds, run between its ops: added to its action, as if not overlapped.
    timed = link_bytes_per_s is not None and device is not None
    spent = [collective_seconds(c.collectives, mode, link_bytes_per_s,
                                gather_once=v <= ACTIVE_STAGES)
             if timed else dict.fromkeys("FBIWUR", 0.0) for c in staged]
    order = with_step_actions(order, m, *({s for s, times in enumerate(spent) if times[kind]}
                                          for kind in "UR"))
    records = [PipelineStage(
        index=s, rank=rank_of[s], modules=_held(stage.module, depth), params=report.params,
        inputs=[TensorSpec.of(t.shape, t.dtype) for t in stage.args
                if isinstance(t, torch.Tensor)],
        forward=report.total - report.backward, backward=report.backward,
        backward_weight=report.backward_weight if two_passes else None,
        forward_s=times[s]["F"], backward_s=times[s]["B"], backward_input_s=times[s].get("I"),
        backward_weight_s=times[s].get("W"), forward_collectives_s=spent[s]["F"],
        backward_collectives_s=spent[s]["B"], backward_input_collectives_s=spent[s]["I"],
        backward_weight_collectives_s=spent[s]["W"], unshard_s=spent[s]["U"],
        reduce_grad_s=spent[s]["R"],
        sends=sends[s], receives=receives[s], collectives=staged[s].collectives,
        stands_for=list(range(rank_of[s] * width, (rank_of[s] + 1) * width)),
        counted_as=counted_as[s])
        for s, (stage, report) in enumerate(zip(split, reports))]

    def transfer_s(src: int, dst: int, kind: str) -> float:
        """What stage ``src`` sends stage ``dst`` for the action, over the link: the
        activations ``dst`` takes from ``src`` (F), or the gradients of those ``src`` took from
        ``dst`` (B)."""
        taker, giver = (split[dst], src) if kind == "F" else (split[src], dst)
        crossing = [t for t, source in zip(taker.args, taker.sources) if source == giver
                    and isinstance(t, torch.Tensor) and (kind == "F" or t.requires_grad)]
        return sum(t.numel() * t.element_size() for t in crossing) / link_bytes_per_s

    senders = {s: {src for src in stage.sources if src is not None}
               for s, stage in enumerate(split)}
    gradients = {s: {dst for dst, stage in enumerate(split)
                     for t, src in zip(stage.args, stage.sources)
                     if src == s and isinstance(t, torch.Tensor) and t.requires_grad}
                 for s in range(len(split))}
    actions, ranks, step, bubble, slowest = timeline(
        order, lambda s, kind: times[s].get(kind, 0.0) + spent[s][kind],
        transfer_s if link_bytes_per_s else (lambda src, dst, kind: 0.0), senders, gradients)
    record = PipelineReport(
        model=type(model).__name__ if model is not None else "stages", mode=mode,
        schedule=schedule, torch_schedule=SCHEDULES[schedule].torch_class, microbatches=m,
        pp=pp, tp=tp, fsdp=fsdp, stages_per_rank=v, device=where, timer=timer,
        times="measured" if measure else "roofline" if device else "unit",
        link_bytes_per_s=link_bytes_per_s,
        stages=records, timeline=actions, ranks=ranks, step_time_s=step,
        bubble_fraction=bubble, slowest_rank=slowest)
    return PipelineAnalysis(record, reports, counts)


def _counted(split: list[Stage], rank_of: dict[int, int],
             count_stage: Callable[[int, int, Stage], Counted], grad: bool, share: bool,
             first_apart: bool = False) -> tuple[list[Counted], list[int]]:
    """Each stage's count, and the stage whose count it is: with ``share``, a stage whose
    call is alike an earlier stage's (`call_key`: the same ops on the same shapes, module for
    module; the middle stages of a stack of identical layers) is not counted again, but takes
    that stage's count with its module paths, its own at the same places. ``first_apart``:
    the first stage is counted otherwise (its backward whole), so it stands for no other."""
    if not share:
        return [count_stage(s, rank_of[s], stage) for s, stage in enumerate(split)], \
            list(range(len(split)))
    with torch.enable_grad() if grad else torch.no_grad():
        keys = [call_key(stage.module, stage.args, stage.kwargs) for stage in split]
    counts: list[Counted] = []
    counted_as: list[int] = []
    first: dict[tuple, int] = {}
    for s, (stage, key) in enumerate(zip(split, keys)):
        alike = s if key is None or (first_apart and s == 0) else first.setdefault(key, s)
        counted_as.append(alike)
        if alike == s:
            counts.append(count_stage(s, rank_of[s], stage))
            continue
        paths = dict(zip((p for p, _ in split[alike].module.named_modules(
                             remove_duplicate=False)),
                         (p for p, _ in stage.module.named_modules(remove_duplicate=False))))
        counts.append(with_paths(counts[alike], paths))
    return counts, counted_as


def _looped(schedule: str) -> bool:
    if schedule not in SCHEDULES:
        raise InputError(f"no pipeline schedule {schedule!r}; the schedules: "
                         f"{', '.join(SCHEDULES)} (docs/pipeline.md)")
    return SCHEDULES[schedule].looped


def layer_split_points(model: torch.nn.Module, stages: int) -> list[str]:
    """The paths to split ``model`` before for ``stages`` stages of whole layers: stage k
    starts at layer ``k * n // stages`` of its n layers, so stage 0 holds the embedding and the
    first layers, the last stage the last layers, the final norm and the head. The layers are
    a Hugging Face model's decoder layers (``_no_split_modules``), else the entries of its
    outermost ``ModuleList``, else of its outermost ``Sequential``."""
    layers = _layers(model)
    return [layers[held.start] for held in stage_layers(len(layers), stages, model)[1:]]


def stage_layers(layers: int, stages: int, model: torch.nn.Module | None = None,
                 ) -> list[range]:
    """The layer indices each of ``stages`` stages holds when ``layers`` layers (of ``model``,
    named in the error) are split evenly: stage k from layer ``k * layers // stages``
    (`layer_split_points`)."""
    if not 1 <= stages <= layers:
        raise InputError(f"{type(model).__name__ if model is not None else 'the model'} has "
                         f"{layers} layers: it splits into 1 to {layers} stages of whole "
                         f"layers, not {stages}")
    return [range(k * layers // stages, (k + 1) * layers // stages) for k in range(stages)]


def _layers(model: torch.nn.Module) -> list[str]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        found = [path for path, m in model.named_modules() if type(m).__name__ in names]
        if found:
            return found
    for kind in (torch.nn.ModuleList, torch.nn.Sequential):  # a Sequential: the layers
        for path, module in model.named_modules():
            if isinstance(module, kind):  # the first found is the outermost
                return [f"{path}.{name}" if path else name
                        for name, _ in module.named_children()]
    raise InputError(f"{type(model).__name__} has no list of layers to split by (no "
                     f"ModuleList or Sequential): give the split points' module paths as "
                     f"stages=[...]")


def _stages(model, args, kwargs, stages, mode: str) -> tuple[list[Stage], int | None]:
    """The stages with what each receives, and the depth to cut each one's module paths at
    (None: its children's)."""
    grad = mode == "train"
    if isinstance(stages, int) and not isinstance(stages, bool):
        if model is None or stages < 1:
            raise InputError(f"stages={stages}: a count of stages is 1 or more, and splits a "
                             f"model (pass it)")
        stages = layer_split_points(model, stages) if stages > 1 else []
    if not isinstance(stages, (list, tuple)):
        raise InputError(f"stages={stages!r}: stages takes a count, module paths of the model "
                         f"to split before, or the stage modules (with model=None)")
    stages = list(stages)
    if stages and all(isinstance(s, Stage) for s in stages):
        return stages, None
    if stages and all(isinstance(s, torch.nn.Module) for s in stages):
        return _chained(stages, tuple(args), kwargs, grad), None
    if model is None or not all(isinstance(s, str) for s in stages):
        raise InputError("stages takes a count, module paths of the model to split before, "
                         "or the stage modules (with model=None)")
    if not stages:
        return [Stage(model, tuple(args), kwargs, [None] * len(args))], 1
    depth = max(len(path.split(".")) for path in stages)
    return split_stages(model, tuple(args), kwargs, stages, grad=grad), depth


def _chained(modules: list[torch.nn.Module], args: tuple, kwargs: dict | None,
             grad: bool) -> list[Stage]:
    """Stage modules the caller built, each taking what the one before returns."""
    stages, sources = [], [None] * len(args)
    for index, module in enumerate(modules):
        stages.append(Stage(module, args, kwargs, sources))
        with torch.enable_grad() if grad else torch.no_grad():
            out = module(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        args, kwargs = tuple(as_received(t, grad) for t in outputs), None
        sources = [index] * len(args)
    return stages


def _transfers(stages: list[Stage], rank_of: dict[int, int], mode: str, width: int = 1):
    """Per stage: its sends and its receives, one per tensor a stage takes from a stage on
    another rank (between two stages of one rank nothing crosses a link), each peer the
    global rank ``pipeline rank * width`` (the representative of the peer stage's ``width``
    ranks)."""
    sends: list[list[Collective]] = [[] for _ in stages]
    receives: list[list[Collective]] = [[] for _ in stages]
    for dst, stage in enumerate(stages):
        for tensor, src in zip(stage.args, stage.sources):
            if src is None or not isinstance(tensor, torch.Tensor) \
                    or rank_of[src] == rank_of[dst]:
                continue
            to, of = rank_of[dst] * width, rank_of[src] * width
            carried = f"stage {src} to stage {dst}"
            sends[src].append(_p2p("send", tensor, "forward", to, carried))
            receives[dst].append(_p2p("recv", tensor, "forward", of, carried))
            if mode == "train" and tensor.requires_grad:
                carried = f"gradient, stage {dst} to stage {src}"
                sends[dst].append(_p2p("send", tensor, "backward", of, carried))
                receives[src].append(_p2p("recv", tensor, "backward", to, carried))
    return sends, receives


def _p2p(op: str, tensor: torch.Tensor, phase: str, peer: int, carried: str) -> Collective:
    return Collective(op=op, bytes=tensor.numel() * tensor.element_size(),
                      dtype=str(tensor.dtype).removeprefix("torch."), phase=phase, group_size=2,
                      group="pp", mesh_dim="pp", module="", node=carried,
                      torch_op=f"torch.distributed.i{op}", bandwidth_factor=1.0, peer=peer)


def _in_weight_pass(counted: Counted) -> Counted:
    """The first stage's count with its whole backward in the weight pass: torch's
    ``backward_one_chunk`` skips the input pass on stage 0 and runs its full backward when the
    weights' turn comes (torch/distributed/pipelining/stage.py)."""
    nodes, collectives = ([n.model_copy(update={"gradient": "weight"}) if n.phase == "backward"
                           else n for n in items] for items in (counted.nodes,
                                                                counted.collectives))
    return dataclasses.replace(counted, nodes=nodes, collectives=collectives, split=True)


def _check_split(reports: list[Report], counts: list[Counted], schedule: str,
                 link_bytes_per_s: float | None) -> None:
    """A zero-bubble schedule's stages are counted in two backward passes (``reports``), and
    their own collectives (``counts``') are not told apart by pass."""
    if any(report.backward_weight is None for report in reports):
        raise InputError(f"schedule {schedule!r} runs each backward as two passes, input then "
                         f"weight gradients: count_stage's counts must be counted with "
                         f"count_call(..., split_backward=True)")
    if link_bytes_per_s is not None and any(c.phase == "backward" and not c.gradient
                                            for counted in counts for c in counted.collectives):
        raise InputError(f"schedule {schedule!r} splits each backward in two passes, and a "
                         f"stage's own backward collectives are not assigned to either: count "
                         f"the stages with analyze(..., split_backward=True), or give no "
                         f"link_bytes_per_s, or a schedule with a whole backward")


def _measured(model, split: list[Stage], args: Any, kwargs: dict | None, mode: str,
              warmup: int, repeat: int, two_passes: bool, whole_too: bool = False,
              ) -> tuple[str, str, list[dict[str, float]]]:
    """Where the stages ran, how they were timed, and each one's measured seconds on what it
    receives: forward (``F``) and backward (``B``), with ``two_passes`` its input and weight
    passes (``I``, ``W``) too, and with ``whole_too`` its whole backward ``B`` timed as well
    (else the two passes')."""
    from ...capture.placement import check_runnable, device_label
    from ...runtime.call_times import call_seconds

    home = check_runnable(model if model is not None else split[0].module,
                          type(model).__name__ if model is not None else "stage 0",
                          args, kwargs, None)
    times = [call_seconds(stage.module, stage.args, stage.kwargs, train=mode == "train",
                          warmup=warmup, repeat=repeat, split=two_passes, whole=s == 0)
             for s, stage in enumerate(split)]
    if whole_too:
        times = [{**passes, "B": call_seconds(stage.module, stage.args, stage.kwargs, train=True,
                                              warmup=warmup, repeat=repeat)["B"]}
                 for passes, stage in zip(times, split)]
    clock = "CUDA events" if home.type == "cuda" else "perf_counter_ns"
    passes = (" in torch's two passes, stage_backward_input then stage_backward_weight"
              if two_passes else "")
    timer = (f"each stage run on what it receives, {clock}, median of {repeat} after "
             f"{warmup} warmup; backward: the gradients of its parameters and inputs from its "
             f"outputs seeded with ones{passes}")
    return device_label(home), timer, times


def _held(module: torch.nn.Module, depth: int | None) -> list[str]:
    """The module paths a stage holds: each parameter's module, cut at ``depth`` parts (None:
    the stage module's children, the entries of a child that is a list or dict of modules),
    in order, once each."""
    paths: dict[str, None] = {}
    for name, _ in module.named_parameters():
        parts = name.split(".")[:-1]
        if depth is None:
            child = module.get_submodule(parts[0]) if parts else None
            cut = 2 if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)) else 1
        paths[".".join(parts[:depth if depth is not None else cut]) or "<root>"] = None
    return list(paths)
