"""``--pp N [--schedule NAME --microbatches M --rank R]``: MODEL split by layer into N stages
as torch.distributed.pipelining splits it, each stage counted on one microbatch (the example
inputs), and one step's timeline under the schedule (`exportflops.parallel.pipeline`).

Times are the roofline's on ``--device-model`` (default h100-sxm), or with ``--profile`` (the
model built on ``--device cpu`` or ``cuda``) each stage's measured forward and backward
(``--warmup``, ``--repeat``); ``--link-gbps`` delays each received tensor by its transfer.
The schedule defaults to 1f1b, the microbatches to N. N is the pipeline ranks: the looped
schedules (interleaved1f1b, loopedbfs, the zero-bubble ones and dualpipev) run two stages on
each.

With ``--tp T`` and/or ``--fsdp F`` the ranks are the mesh (pp, fsdp, tp),
tp innermost as torchtitan lays it out: each stage is counted once, as the rank of its (fsdp,
tp) group with index 0, built under `exportflops.fake_process_group` of the group's ranks (a
stage's own collectives stay in its group) with the llama's tensor-parallel plan and FSDP2 on
the stage's blocks, then the stage (`exportflops.cli.parallel`'s recipe, per stage as
torchtitan applies it to each model chunk); the others of the group do the same work. For any
other model (a Hugging Face decoder) the plan and FSDP2 (each block, then each stage's other
modules as one unit) are applied to the whole model, whose index 0 rank is counted once and
cut into the stages of torch's split (`exportflops.parallel.pipeline_slices`). ``--rank R`` is
a global rank of that mesh (docs/pipeline.md, Composition).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options

if TYPE_CHECKING:
    from ..records import Report

#: The models whose stages are built from their own modules, so compose with --fsdp too.
COMPOSED = ("llama",)


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``'s first stage, (the `PipelineReport`, its view))."""
    from ..parallel.pipeline import DEFAULT_DEVICE, analyze_pipeline
    from ..parallel.pipeline_mesh import llama_stages, on_mesh, rank_report
    from ..parallel.schedules import SCHEDULES
    from ..render.pipeline import pipeline_view

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes,
                                       kwargs=ns.kwargs, hf_options=hf_options(ns))
    schedule = ns.schedule or "1f1b"  # a schedule of SCHEDULES (`check_splits`)
    # --pp N is the ranks; a looped schedule runs two stages on each.
    per_rank = 2 if SCHEDULES[schedule].looped else 1
    composed = ns.tp is not None or ns.fsdp is not None
    two_passes = SCHEDULES[schedule].split_backward and ns.mode == "train"
    if two_passes and composed and ns.model not in COMPOSED:
        _check_untied(model)  # before the whole rank is counted
    stages = ns.pp * per_rank
    ranks: dict = {}  # a whole model's rank, counted once per way of counting its backward
    try:
        count_stage = _composed_counter(ns, model, stages, two_passes, ranks) \
            if composed else None
        # for the whole backwards a split schedule also runs (DualPipeV's)
        count_whole = _composed_counter(ns, model, stages, False, ranks) \
            if composed and two_passes else None
        analysis = analyze_pipeline(
            model, args, kwargs, schedule=schedule,
            # The stages counted (the model's own modules) are the stages timed.
            stages=llama_stages(model, args[0], stages, ns.mode)
            if composed and ns.model in COMPOSED else stages,
            stages_per_rank=per_rank,
            microbatches=ns.microbatches, mode=ns.mode, strict=ns.strict,
            device=ns.device_model or DEFAULT_DEVICE,
            link_bytes_per_s=None if ns.link_gbps is None else ns.link_gbps * 1e9,
            count_stage=count_stage, count_whole=count_whole, measure=ns.profile,
            warmup=ns.warmup, repeat=ns.repeat,
            # The built-in llama's plan is the same on every layer: a stage alike another
            # counts alike on its rank too. A whole model cut into stages is counted once.
            share_alike=composed and ns.model in COMPOSED)
    except InputError as error:  # a split or schedule the flags ask for that cannot be
        raise UsageError(f"--pp {ns.pp} --schedule {schedule}: {error}") from error
    analysis = on_mesh(analysis, ns.fsdp or 1, ns.tp or 1)
    record = analysis.record
    if ns.rank >= record.world_size():
        raise UsageError(f"--rank {ns.rank}: --pp {ns.pp} x --fsdp {record.fsdp} x --tp "
                         f"{record.tp} with schedule {schedule} has {record.world_size()} "
                         f"ranks, 0..{record.world_size() - 1}.")
    pipeline_rank = ns.rank // (record.fsdp * record.tp)
    return rank_report(analysis, ns.rank), (record, partial(pipeline_view, rank=pipeline_rank))


def _composed_counter(ns: argparse.Namespace, model, stages: int, split_backward: bool,
                      ranks: dict):
    if ns.model not in COMPOSED:
        from ..parallel.pipeline import layer_split_points

        return _sliced_counter(ns, layer_split_points(model, stages), split_backward, ranks)

    def build(device):
        built, args, _ = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                      hf_options=hf_options(ns))
        return built, args

    return stage_rank_counter(build, ns.model, len(model.layers), stages, tp=ns.tp,
                              fsdp=ns.fsdp, mode=ns.mode, strict=ns.strict,
                              split_backward=split_backward)


def stage_rank_counter(build: Callable, spec: str, layers: int, stages: int, *,
                       tp: int | None, fsdp: int | None, mode: str = "forward",
                       strict: bool = False, split_backward: bool = False):
    """``count_stage`` of `exportflops.parallel.pipeline.analyze_pipeline` for a built-in
    ``spec`` (a key of `COMPOSED`) of ``layers`` layers in ``stages`` stages: stage s counted
    as the rank of its (fsdp, tp) group with index 0, the model built again on meta by
    ``build(device) -> (model, args)`` under a fake process group of that group (copied onto
    fake tensors for FSDP2), split by its tensor-parallel plan (``tp``) and FSDP2 (``fsdp``,
    on the stage's blocks, then the stage). ``split_backward``: each stage but the first
    (whose backward torch runs whole) counted with its backward in the zero-bubble schedules'
    two passes (`exportflops.graph.passes`)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from ..api import analyze
    from ..parallel.pipeline import stage_layers
    from ..parallel.pipeline_mesh import LlamaStage
    from ..parallel.ranks import fake_copy, fake_process_group
    from .parallel import _fully_shard, _parallelize

    held = stage_layers(layers, stages)
    degrees = {name: n for name, n in (("fsdp", fsdp), ("tp", tp)) if n is not None}

    def count(index: int, rank: int, stage) -> Report:
        # The stage's own collectives run in its (fsdp, tp) group: the group's rank 0 stands
        # for the stage, under a process group of that group's ranks. One group for every
        # stage also keeps torch's caches right: DeviceMesh compares equal by layout alone,
        # so a mesh of other process groups would hit the groups cached for the one before.
        with fake_process_group((fsdp or 1) * (tp or 1), rank=0):
            mesh = init_device_mesh("cpu", tuple(degrees.values()),
                                    mesh_dim_names=tuple(degrees))
            built, args = build(torch.device("meta"))
            inputs = args if index == 0 else _received(built, args[0], mode)
            if fsdp is not None:  # FSDP2 refuses meta parameters
                built, inputs, _ = fake_copy(built, inputs, {})
            if tp is not None:
                _parallelize(spec, built, mesh["tp"])
            part = LlamaStage(built, held[index], first=index == 0, last=index == stages - 1)
            if fsdp is not None:  # torchtitan's default under pipeline parallelism
                _fully_shard(spec, part, mesh["fsdp"], reshard_after_forward=False)
            report = analyze(part, inputs, None, mode=mode, strict=strict,
                             split_backward=split_backward and index > 0)
        return _dims_named(report, degrees)

    return count


def _sliced_counter(ns: argparse.Namespace, split_points: list[str], split_backward: bool,
                    ranks: dict):
    """``count_stage`` for a model whose stages are not built from its own modules: one rank
    of the whole model (tensor-parallel and FSDP index 0) counted once, its report cut into
    the stages of the split (`exportflops.parallel.pipeline_slices`), each holding the
    parameters of torch's split stage. FSDP2 is applied as torchtitan applies it to each
    stage: each block, then per stage one unit of its modules outside the blocks (its root's
    parameters: the embedding on the first, the final norm and head on the last), then the
    root, which holds nothing of its own. ``split_backward``: the rank counted again with each
    stage's backward in the zero-bubble schedules' two passes, split at the stage's input
    (`exportflops.graph.passes.stage_input_way`). ``ranks`` keeps each count of the whole rank
    (by ``split_backward``) for the counters sharing it."""
    import torch

    from ..parallel.pipeline_slices import held_parameters, stage_report
    from ..records import TensorSpec
    from ..torch_internals import pytree

    degrees = {name: n for name, n in (("fsdp", ns.fsdp), ("tp", ns.tp)) if n is not None}

    def count(index: int, rank: int, stage) -> Report:
        model, report, stage_of = _whole_rank(ns, split_points, split_backward, ranks)
        part = stage_report(report, index, stage_of, held_parameters(model, stage.module))
        inputs = [TensorSpec.of(t.shape, t.dtype) for t in pytree.tree_leaves(
            (stage.args, stage.kwargs)) if isinstance(t, torch.Tensor)]
        return _dims_named(part, degrees).model_copy(update={"inputs": inputs})

    return count


def _whole_rank(ns: argparse.Namespace, split_points: list[str], split_backward: bool,
                ranks: dict):
    """(the rank's model, its report, each node's stage) of the whole model, counted once per
    ``split_backward`` into ``ranks``; split, each stage's input pass is what an earlier
    stage's backward depends on, read off the unsplit count's stages."""
    from ..graph.passes import stage_input_way
    from ..parallel.pipeline_slices import node_stages
    from .parallel import parallelized

    if split_backward not in ranks:
        way = False
        if split_backward:
            _, unsplit, stage_of = _whole_rank(ns, split_points, False, ranks)
            way = partial(_stage_way, stage_input_way, stage_of,
                          {node.name: node.op for node in unsplit.nodes})
        units: list[list[str]] = []  # each stage's unit, as module paths
        model, report, _ = parallelized(
            argparse.Namespace(**{**vars(ns), "rank": 0, "split_backward": way}),
            shard=partial(_stage_units, split_points, units))
        stage_of = node_stages(report, split_points)
        _check_units_ran(report, stage_of, units)
        ranks[split_backward] = (model, report, stage_of)
    return ranks[split_backward]


def _check_untied(model) -> None:
    """A parameter under two names (a tied embedding and head) gets its gradient summed from
    both uses in the whole rank's backward, which would put the head's part in the last
    stage's input pass: refused with the zero-bubble schedules."""
    from .parallel import tied_names

    tied = tied_names(model)
    if tied:
        name, first = next(iter(tied.items()))
        raise UsageError(f"--pp with a zero-bubble --schedule on --tp/--fsdp ranks: "
                         f"{type(model).__name__}'s parameter {first!r} is also {name!r} "
                         f"(tied), its gradient summed from both uses in the whole rank's "
                         f"backward; build the model untied (tie_word_embeddings=False), "
                         f"or pick a schedule with a whole backward.")


def _stage_way(stage_input_way, stage_of: dict[str, int], ops: dict[str, str], graph):
    """The input passes of the rank's graph, each node's stage read off an earlier count of
    the same rank by its name (the trace names its nodes alike each time: checked, each
    backward op must have the name of the same op in the first count)."""
    from torch._ops import OpOverload

    from ..graph.walk import phase

    unnamed = [node.name for node in graph.nodes if node.op == "call_function"
               and isinstance(node.target, OpOverload) and phase(node) == "backward"
               and (node.name not in stage_of or ops.get(node.name) != str(node.target))]
    if unnamed:
        raise InputError(f"the rank traced again names {len(unnamed)} backward ops otherwise "
                         f"than the first trace ({', '.join(unnamed[:3])}): their stages are "
                         f"unknown, so the backward cannot be split at the stages' inputs; "
                         f"pick a schedule with a whole backward.")
    return stage_input_way(graph, lambda node: stage_of.get(node.name))


def _stage_units(split_points: list[str], paths: list[list[str]], spec: str, model,
                 mesh) -> None:
    """FSDP2 on ``model`` as torchtitan shards each pipeline stage: its blocks, then each
    stage's modules outside them as one unit (`stage_units`, standing for the stage's root),
    then the whole model's root, which holds none; every unit keeps its parameters gathered
    after the forward, torchtitan's default under pipeline parallelism (``reshard_after_forward
    = not pp_enabled``: no all-gather per microbatch). ``paths`` gets each stage unit's module
    paths."""
    from torch.distributed.fsdp import fully_shard

    from ..errors import BuildError
    from ..parallel.fsdp_blocks import blocks_of
    from ..parallel.pipeline_slices import stage_units

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
        raise BuildError(f"--pp with --fsdp {mesh.size()}: fully_shard on {spec}'s blocks, "
                         f"then each stage's other modules, then the root, failed: "
                         f"{type(error).__name__}: {error}") from error


def _dims_named(report: Report, degrees: dict[str, int]) -> Report:
    """``report`` with its collectives' mesh dimension named when the mesh has one dimension:
    its default group names none."""
    if len(degrees) > 1:
        return report
    (name,) = degrees
    return report.model_copy(update={"collectives": [
        c.model_copy(update={"mesh_dim": c.mesh_dim or name}) for c in report.collectives]})


def _received(model, tokens, mode: str) -> tuple:
    """What a Llama stage after the first takes per microbatch, made where ``tokens`` are: the
    hidden state (B, T, dim), needing a gradient in training, and the rotary tables (T, hd)."""
    import torch

    config, (batch, seq) = model.config, tokens.shape
    dtype = next(model.parameters()).dtype
    hidden = torch.zeros(batch, seq, config.dim, dtype=dtype, device=tokens.device,
                         requires_grad=mode == "train")
    cos, sin = (torch.zeros(seq, config.head_dim, device=tokens.device) for _ in range(2))
    return hidden, cos, sin


def _check_units_ran(report, stage_of: dict[str, int], units: list[list[str]]) -> None:
    """Each stage's FSDP2 unit of modules outside the blocks (``units``, their paths) is
    gathered in that stage: a module outside the blocks that runs between them, not before
    the first or after the last, would be in the wrong stage's unit."""
    for stage, unit in enumerate(units):
        gathered = {stage_of.get(c.node) for c in report.collectives
                    if c.op == "all_gather" and c.module in unit}
        if gathered - {stage}:
            raise UsageError(f"--pp with --fsdp: {report.model}'s modules outside its "
                             f"layers ({', '.join(unit)}) do not all run in stage {stage}, so "
                             f"one FSDP2 unit per stage cannot hold them; analyze --pp with "
                             f"--tp alone, or --fsdp without --pp.")
