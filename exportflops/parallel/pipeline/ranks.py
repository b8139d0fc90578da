"""A pipeline on a `Layout`'s mesh (pp, fsdp, tp), tp innermost as torchtitan lays it out: each
stage counted once, as the rank of its (fsdp, tp) group with index 0, the others of the group
doing the same work (`count_pipeline`'s ``fsdp`` and ``tp`` place them on the mesh).

The built-in Llama's stages are built from its own modules (`llama_stages`), each counted
under `exportflops.fake_process_group` of the group's ranks (a stage's own collectives stay in
its group) with the llama's tensor-parallel plan and FSDP2 on the stage's blocks, then the
stage, as torchtitan applies them to each model chunk (`stage_rank_counter`). For any other
model (a Hugging Face decoder) the plan and FSDP2 (each block, then each stage's other modules
as one unit) are applied to the whole model, whose index 0 rank is counted once and cut into
the stages of torch's split (`exportflops.parallel.pipeline.slices`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ...aggregate import Counted
from ...api import count_call
from ...count.ranks import fake_copy
from ...errors import BuildError, InputError
from ...examples.llama import Llama
from ..checks import DEFAULT_SCHEDULE, check_call
from ..layout import Layout
from ..per_rank import Builder, built_model, counted_rank_of
from .analysis import DEFAULT_DEVICE, PipelineAnalysis, count_pipeline, layer_split_points
from .mesh import llama_stages
from .schedules import SCHEDULES, stages_per_rank


def analyze_pipeline(model: torch.nn.Module | Builder | None, args: Any = (),
                     kwargs: dict | None = None, *, stages: Any = None,
                     layout: Layout | None = None, schedule: str = "1f1b",
                     microbatches: int | None = None, stages_per_rank: int | None = None,
                     mode: str = "train", device: str | None = DEFAULT_DEVICE,
                     link_bytes_per_s: float | None = None, strict: bool = False,
                     measure: bool = False, warmup: int = 3, repeat: int = 10,
                     ) -> PipelineAnalysis:
    """Split ``model`` into pipeline stages, count each on one microbatch ``model(*args,
    **kwargs)``, and lay out one step of ``microbatches`` (default: as many as ranks) under
    ``schedule`` (a key of `SCHEDULES`).

    Either ``stages``, the split yourself, every stage on one rank: a count (the model's layers
    split evenly, `layer_split_points`), the module paths to split before (torch's
    ``SplitPoint.BEGINNING``), the stage modules themselves (``model`` None; each takes what
    the one before returns), or `Stage`s with what each receives (`llama_stages`), with
    ``stages_per_rank`` ``v`` for the looped schedules (default 2, stage s on rank
    s % (stages / v)); or ``layout``, a `Layout` of ``pp`` pipeline ranks whose stages each
    run on ``fsdp x tp`` ranks (`analyze_pipeline_ranks`; ``model`` may then be a function
    ``device -> (model, args, kwargs)``). A stage whose call is alike an earlier one's is
    counted once (`PipelineStage.counted_as`). ``device``: the roofline's device for each
    action's time, or None for one unit per action. ``measure``: each action's time is measured
    instead, each stage run for real where the model and inputs are (cpu or cuda) on what it
    receives, median of ``repeat`` runs after ``warmup`` (`exportflops.runtime.call_times`).
    """
    timing = dict(schedule=schedule, microbatches=microbatches, mode=mode, device=device,
                  link_bytes_per_s=link_bytes_per_s, strict=strict, measure=measure,
                  warmup=warmup, repeat=repeat)
    if layout is None:
        if stages is None:
            raise InputError("analyze_pipeline needs stages= (a count, split points, stage "
                             "modules or Stages) or layout= (a Layout whose pp is the ranks)")
        return count_pipeline(model, args, kwargs, stages=stages,
                              stages_per_rank=stages_per_rank, **timing)
    if stages is not None or stages_per_rank is not None:
        raise InputError(f"analyze_pipeline(layout={layout}) splits the model into "
                         f"layout.pp={layout.pp} ranks itself (two stages each under a looped "
                         f"schedule): give stages= without layout= to split it yourself")
    return analyze_pipeline_ranks(model, args, kwargs, layout=layout, **timing)


def analyze_pipeline_ranks(model: torch.nn.Module | Builder, args: Any = (),
                           kwargs: dict | None = None, *, layout: Layout,
                           schedule: str | None = None, microbatches: int | None = None,
                           mode: str = "train", device: str | None = DEFAULT_DEVICE,
                           link_bytes_per_s: float | None = None, strict: bool = False,
                           measure: bool = False, warmup: int = 3, repeat: int = 10,
                           ) -> PipelineAnalysis:
    """``model`` split into ``layout.pp`` pipeline ranks (a looped ``schedule`` runs two stages
    on each), each stage on ``layout.fsdp x layout.tp`` ranks (module docstring), one step of
    ``microbatches`` timed under ``schedule`` (default 1f1b) as `analyze_pipeline` times it
    (``device``, ``link_bytes_per_s``, ``measure``, ``warmup``, ``repeat`` are its), placed on
    the mesh (`exportflops.parallel.pipeline.mesh.rank_report` gives a global rank's
    report). ``model`` as `exportflops.parallel.analyze_ranks` takes it."""
    check_call(layout, schedule=schedule, microbatches=microbatches)
    schedule = schedule or DEFAULT_SCHEDULE
    built, args, kwargs = built_model(model, args, kwargs)
    per_rank = stages_per_rank(schedule)  # pp is the ranks
    composed = layout.fsdp > 1 or layout.tp > 1
    own_modules = composed and isinstance(built, Llama)
    two_passes = SCHEDULES[schedule].split_backward and mode == "train"
    if two_passes and composed and not own_modules:
        _check_untied(built)  # before the whole rank is counted
    stages = layout.pp * per_rank
    counted = partial(_composed_counter, model, (built, args, kwargs), layout, stages,
                      mode=mode, strict=strict, ranks={})
    analysis = count_pipeline(
        built, args, kwargs, schedule=schedule,
        # The stages counted (the model's own modules) are the stages timed.
        stages=llama_stages(built, args[0], stages, mode) if own_modules else stages,
        stages_per_rank=per_rank, microbatches=microbatches, mode=mode, strict=strict,
        device=device, link_bytes_per_s=link_bytes_per_s,
        count_stage=counted(two_passes) if composed else None,
        # for the whole backwards a split schedule also runs (DualPipeV's)
        count_whole=counted(False) if composed and two_passes else None,
        measure=measure, warmup=warmup, repeat=repeat,
        # The built-in llama's plan is the same on every layer: a stage alike another counts
        # alike on its rank too. A whole model cut into stages is counted once.
        share_alike=own_modules, fsdp=layout.fsdp, tp=layout.tp)
    return analysis


def _composed_counter(model: torch.nn.Module | Builder, first: tuple, layout: Layout,
                      stages: int, split_backward: bool, *, mode: str, strict: bool,
                      ranks: dict):
    """``count_stage`` for ``layout``'s stage ranks: the built-in Llama's stages built from its
    own modules, any other model's whole rank cut into the stages of torch's split. ``ranks``
    keeps each count of a whole rank (by ``split_backward``) for the counters sharing it."""
    built, args, kwargs = first
    tp, fsdp = (getattr(layout, name) if getattr(layout, name) > 1 else None
                for name in ("tp", "fsdp"))
    if not isinstance(built, Llama):
        return _sliced_counter(model, first, layout, layer_split_points(built, stages),
                               split_backward, mode=mode, strict=strict, ranks=ranks)

    def build(device: torch.device):
        again, args_again, _ = (copy.deepcopy(built), args, kwargs) \
            if isinstance(model, torch.nn.Module) else model(device)
        return again, args_again

    return stage_rank_counter(build, len(built.layers), stages, tp=tp, fsdp=fsdp, mode=mode,
                              strict=strict, split_backward=split_backward)


def stage_rank_counter(build: Callable, layers: int, stages: int, *,
                       tp: int | None, fsdp: int | None, mode: str = "forward",
                       strict: bool = False, split_backward: bool = False):
    """``count_stage`` of `exportflops.parallel.pipeline.analysis.count_pipeline` for a built-in
    model (one of `COMPOSED`) of ``layers`` layers in ``stages`` stages: stage s counted
    as the rank of its (fsdp, tp) group with index 0, the model built again on meta by
    ``build(device) -> (model, args)`` under a fake process group of that group (copied onto
    fake tensors for FSDP2), split by its tensor-parallel plan (``tp``) and FSDP2 (``fsdp``,
    on the stage's blocks, then the stage). ``split_backward``: each stage but the first
    (whose backward torch runs whole) counted with its backward in the zero-bubble schedules'
    two passes (`exportflops.graph.passes`)."""
    from ..parallelize import fully_shard_blocks, tensor_parallel
    from .analysis import stage_layers
    from .mesh import LlamaStage

    held = stage_layers(layers, stages)
    degrees = {name: n for name, n in (("fsdp", fsdp), ("tp", tp)) if n is not None}
    layout = Layout(fsdp=fsdp or 1, tp=tp or 1)  # a stage's (fsdp, tp) group

    def count(index: int, rank: int, stage) -> Counted:
        # The stage's own collectives run in its (fsdp, tp) group: the group's rank 0 stands
        # for the stage, under a process group of that group's ranks. One group for every
        # stage also keeps torch's caches right: DeviceMesh compares equal by layout alone,
        # so a mesh of other process groups would hit the groups cached for the one before.
        with layout.mesh(*degrees, rank=0) as mesh:
            built, args = build(torch.device("meta"))
            inputs = args if index == 0 else _received(built, args[0], mode)
            if fsdp is not None:  # FSDP2 refuses meta parameters
                built, inputs, _ = fake_copy(built, inputs, {})
            if tp is not None:
                tensor_parallel(built, mesh["tp"])
            part = LlamaStage(built, held[index], first=index == 0, last=index == stages - 1)
            if fsdp is not None:  # torchtitan's default under pipeline parallelism
                fully_shard_blocks(part, mesh["fsdp"], reshard_after_forward=False)
            return count_call(part, inputs, None, mode=mode, strict=strict,
                              split_backward=split_backward and index > 0)

    return count


def _sliced_counter(model: torch.nn.Module | Builder, first: tuple, layout: Layout,
                    split_points: list[str], split_backward: bool, *, mode: str, strict: bool,
                    ranks: dict):
    """``count_stage`` for a model whose stages are not built from its own modules: one rank
    of the whole model (tensor-parallel and FSDP index 0) counted once, its nodes selected into
    the stages of the split (`exportflops.parallel.pipeline.slices`), each holding the
    parameters of torch's split stage. FSDP2 is applied as torchtitan applies it to each
    stage: each block, then per stage one unit of its modules outside the blocks (its root's
    parameters: the embedding on the first, the final norm and head on the last), then the
    root, which holds nothing of its own. ``split_backward``: the rank counted again with each
    stage's backward in the zero-bubble schedules' two passes, split at the stage's input
    (`exportflops.graph.passes.stage_input_way`)."""
    from .slices import held_parameters, received, stage_counted

    whole = partial(_whole_rank, model, first, layout, split_points, mode=mode, strict=strict,
                    ranks=ranks)

    def count(index: int, rank: int, stage) -> Counted:
        split, counted, stage_of = whole(split_backward)
        return stage_counted(counted, index, stage_of, held_parameters(split, stage.module),
                             received(stage))

    return count


def _whole_rank(model: torch.nn.Module | Builder, first: tuple, layout: Layout,
                split_points: list[str], split_backward: bool, *, mode: str, strict: bool,
                ranks: dict):
    """(the rank's model, its count, each node's stage) of the whole model, counted once per
    ``split_backward`` into ``ranks``; split, each stage's input pass is what an earlier
    stage's backward depends on, the nodes' stages read off the graph being counted (no
    count of the rank before it)."""
    from .slices import node_stages

    if split_backward not in ranks:
        units: list[list[str]] = []  # each stage's unit, as module paths
        built, args, kwargs = first
        way = partial(_stage_way, split_points, type(built).__name__) if split_backward \
            else False
        split, counted = counted_rank_of(
            built, args, kwargs, Layout(fsdp=layout.fsdp, tp=layout.tp), rank=0,
            shard=partial(_stage_units, split_points, units), mode=mode, strict=strict,
            split_backward=way)
        stage_of = node_stages(counted, split_points)
        _check_units_ran(counted, stage_of, units)
        ranks[split_backward] = (split, counted, stage_of)
    return ranks[split_backward]


def _check_untied(model) -> None:
    """A parameter under two names (a tied embedding and head) gets its gradient summed from
    both uses in the whole rank's backward, which would put the head's part in the last
    stage's input pass: refused with the zero-bubble schedules."""
    from ..parallelize import tied_names

    tied = tied_names(model)
    if tied:
        name, first = next(iter(tied.items()))
        raise InputError(f"a zero-bubble schedule on tp/fsdp stage ranks: "
                         f"{type(model).__name__}'s parameter {first!r} is also {name!r} "
                         f"(tied), its gradient summed from both uses in the whole rank's "
                         f"backward; build the model untied (tie_word_embeddings=False), "
                         f"or pick a schedule with a whole backward.")


def _stage_way(split_points: list[str], model: str, graph):
    """The input passes of the rank's graph (of ``model``) cut into the stages of a split
    before each of ``split_points``."""
    from ...graph.passes import stage_input_way
    from .slices import graph_stages

    stage_of = graph_stages(graph, split_points, model)
    return stage_input_way(graph, lambda node: stage_of.get(node.name))


def _stage_units(split_points: list[str], paths: list[list[str]], model, mesh) -> None:
    """FSDP2 on ``model`` as torchtitan shards each pipeline stage: its blocks, then each
    stage's modules outside them as one unit (`stage_units`, standing for the stage's root),
    then the whole model's root, which holds none; every unit keeps its parameters gathered
    after the forward, torchtitan's default under pipeline parallelism (``reshard_after_forward
    = not pp_enabled``: no all-gather per microbatch). ``paths`` gets each stage unit's module
    paths."""
    from torch.distributed.fsdp import fully_shard

    from ..fsdp_blocks import blocks_of
    from .slices import stage_units

    units = stage_units(model, split_points)
    where = {id(m): p for p, m in model.named_modules()}
    paths.extend([where[id(m)] for m in unit] for unit in units)
    try:
        for block in blocks_of(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=False)
        for unit in units:
            if unit:
                fully_shard(unit, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    except Exception as error:  # FSDP2 refuses the model as built
        raise BuildError(f"pipeline stages on {mesh.size()} fsdp ranks: fully_shard on "
                         f"{type(model).__name__}'s blocks, then each stage's other modules, "
                         f"then the root, failed: "
                         f"{type(error).__name__}: {error}") from error


def _received(model, tokens, mode: str) -> tuple:
    """What a Llama stage after the first takes per microbatch, made where ``tokens`` are: the
    hidden state (B, T, dim), needing a gradient in training, and the rotary tables (T, hd)."""
    config, (batch, seq) = model.config, tokens.shape
    dtype = next(model.parameters()).dtype
    hidden = torch.zeros(batch, seq, config.dim, dtype=dtype, device=tokens.device,
                         requires_grad=mode == "train")
    cos, sin = (torch.zeros(seq, config.head_dim, device=tokens.device) for _ in range(2))
    return hidden, cos, sin


def _check_units_ran(counted: Counted, stage_of: dict[str, int], units: list[list[str]],
                     ) -> None:
    """Each stage's FSDP2 unit of modules outside the blocks (``units``, their paths) is
    gathered in that stage: a module outside the blocks that runs between them, not before
    the first or after the last, would be in the wrong stage's unit."""
    for stage, unit in enumerate(units):
        gathered = {stage_of.get(c.node) for c in counted.collectives
                    if c.op == "all_gather" and c.module in unit}
        if gathered - {stage}:
            raise InputError(f"pipeline stages on fsdp ranks: {counted.model}'s modules outside "
                             f"its layers ({', '.join(unit)}) do not all run in stage {stage}, "
                             f"so one FSDP2 unit per stage cannot hold them; analyze the "
                             f"pipeline with tp alone, or fsdp without pp.")
