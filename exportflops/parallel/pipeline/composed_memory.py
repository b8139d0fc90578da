"""The memory of one step of a rank of a pipeline composed with tensor parallelism and FSDP2
(`memory_ranks` with ``Layout(pp=P, fsdp=F, tp=T)``), as torchtitan builds such a rank
(``pipeline_llama`` then ``parallelize_llama`` on each model chunk,
torchtitan/models/llama3/infra/):

1. the rank's stages are made of the model's own modules (`LlamaStage` for the built-in
   Llama, `DecoderStage` for a transformers decoder), as the FLOPs of the same layout count
   them (`exportflops.parallel.pipeline.ranks`): torch's ``pipeline()`` split cannot take a
   tensor-parallel plan (`exportflops.parallel.pipeline.decoder_stage`);
2. on a fake copy of the model, under a fake process group of the rank's (fsdp, tp) group
   (its index in the group: ``fsdp_i x tp + tp_i``, `Layout`): the model's tensor-parallel
   plan on ``tp``, then a checkpoint plan's blocks, then FSDP2 on each stage (its blocks,
   then the stage), each unit kept gathered after its forward (``reshard_after_forward =
   not pp_enabled``, torchtitan's default: no all-gather per microbatch);
3. the step of the rank's microbatches replayed as torch's schedule runs them
   (`exportflops.parallel.pipeline.stage_memory`), FSDP2's stages as torch's runtime drives
   them: every backward without gradient sync, so each unit's gradients accumulate
   unsharded over the microbatches, reduce-scattered after the last
   (``perform_reduce_grad``).

What a stage receives is what the unsplit stages pass (the plan's layers end replicated): the
hidden state and the rotary tables, whole on every rank of the group.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ...checkpointing import Blocks, held_blocks, wrap_plan
from ...errors import LayoutError
from ...examples.llama import Llama
from ...records.memory import MemoryReport
from ...torch_internals import require
from ..layout import Layout
from ..per_rank import Builder, built_model
from .stage_memory import rank_order, replayed


def composed_pipeline_memory(model: torch.nn.Module | Builder, args: Any,
                             kwargs: dict | None, *, layout: Layout, rank: int,
                             schedule: str, microbatches: int | None, mode: str,
                             checkpoint: Blocks | None = None, **options) -> MemoryReport:
    """The `MemoryReport` of global rank ``rank`` of ``model`` on ``layout`` (``pp`` with
    ``fsdp`` and/or ``tp``; module docstring), ``args``/``kwargs`` one microbatch, one step
    of ``microbatches`` (default ``layout.pp``) under ``schedule``; ``checkpoint``'s blocks
    wrapped in the stages holding them; ``options``: `replayed`'s."""
    from ...count.ranks import fake_copy
    from ..parallelize import fully_shard_blocks
    from ..rank_step import unsharded_storages

    built, args, kwargs = built_model(model, args, kwargs)
    name = type(built).__name__
    if kwargs:
        raise LayoutError(f"{layout}: {name}'s stages of its own modules take the token ids "
                          f"alone, not the keyword inputs {', '.join(kwargs)}: pass args "
                          f"only.")
    at = layout.coordinates(rank)
    per_rank, order = rank_order(layout, at["pp"], schedule, microbatches, mode, name)
    held = sorted({s for s, _, _ in order})
    dims = [dim for dim in ("fsdp", "tp") if getattr(layout, dim) > 1]
    group = Layout(fsdp=layout.fsdp, tp=layout.tp)  # the stage's ranks
    with group.mesh(*dims, rank=at["fsdp"] * layout.tp + at["tp"]) as mesh:
        fake, fake_args, _ = fake_copy(built, tuple(args), {})
        split = split_stages_over_tp(fake, fake_args[0], layout=layout,
                                     stages=layout.pp * per_rank, mode=mode, mesh=mesh)
        rank_model = torch.nn.ModuleDict({f"stage{s}": split[s].module for s in held})
        if checkpoint is not None:
            _checkpoint(rank_model, [stage.module for stage in split], checkpoint,
                        layout=layout, name=name)
        if layout.fsdp > 1:
            for stage in rank_model.values():  # torchtitan's default under pp
                fully_shard_blocks(stage, mesh["fsdp"], reshard_after_forward=False)
        return replayed(rank_model, {s: split[s] for s in held}, order, last=len(split) - 1,
                        name=name, layout=layout, rank=rank, schedule=schedule, mode=mode,
                        resized=(lambda: unsharded_storages(rank_model))
                        if layout.fsdp > 1 else None, **options)


def split_stages_over_tp(model: torch.nn.Module, tokens: torch.Tensor, *, layout: Layout,
                         stages: int, mode: str, mesh) -> list:
    """``model`` (its input one microbatch of ``tokens``) in ``stages`` stages of its own
    modules (module docstring, 1) with what each receives, then split in place by its
    tensor-parallel plan on ``mesh["tp"]`` where ``layout.tp`` is more than 1: a real mesh
    (tests/footprint/pipeline_worker.py builds torch's stages from it on gloo) or a fake one.
    What each stage receives is what the stages pass before the plan splits them (module
    docstring); the stages hold the model's modules, which the plan splits in place."""
    from ..parallelize import tensor_parallel

    fake_mode = require("detect_fake_mode")(tokens)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        split = _own_stages(model, tokens, stages, mode, layout)  # the rope they make: fake
    if layout.tp > 1:
        tensor_parallel(model, mesh["tp"])
    return split


def _own_stages(model: torch.nn.Module, tokens: torch.Tensor, stages: int, mode: str,
                layout: Layout) -> list:
    """``model``'s ``stages`` stages of its own modules with what each receives."""
    from .decoder_stage import decoder_stages
    from .mesh import llama_stages

    if isinstance(model, Llama):
        return llama_stages(model, tokens, stages, mode)
    return decoder_stages(model, tokens, stages, mode, layout=layout)


def _checkpoint(rank_model: torch.nn.ModuleDict, stages: list[torch.nn.Module],
                plan: Blocks, *, layout: Layout, name: str) -> None:
    """``plan``'s blocks (`Blocks` or a `FitPlan`) wrapped in the rank's stages holding them
    (a stage keeps the model's paths); a block no stage holds whole is refused."""
    for path in [*plan.checkpointed, *plan.selective]:
        if not any(path in dict(stage.named_modules()) for stage in stages):
            raise LayoutError(f"{layout}: {name}'s block {path!r} is not a module of any "
                              f"pipeline stage (each holds whole layers): checkpoint whole "
                              f"layers (exportflops.planner.block_paths).")
    for stage in rank_model.values():
        wrap_plan(stage, held_blocks(plan, stage), name=name)
