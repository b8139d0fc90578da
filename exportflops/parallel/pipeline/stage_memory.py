"""The memory of one training step of a pipeline rank (`memory_ranks` with ``Layout(pp=P)``):
the rank's stages (torch's ``pipeline()`` split, `exportflops.capture.pipeline_split`) on a fake
copy, their microbatches run in the order torch's schedule gives the rank
(`pipeline_order`), each storage held as torch.distributed.pipelining's runtime holds it
(torch/distributed/pipelining/stage.py and schedules.py, torch 2.13):

1. a stage's parameters, their gradients (made by the first backward, accumulated in place by
   the later ones, ``AccumulateGrad``) and the optimizer's states, for the whole step;
2. the receive buffers, one per microbatch, made once and kept from step to step: a stage but
   the first receives its inputs into ``args_recv_info[mb]``, a stage but the last its
   outputs' gradients into ``grad_recv_info[mb]`` (``_prepare_forward_infra``,
   ``_prepare_backward_infra``); the first stage's inputs are the batch, every microbatch's;
3. a microbatch's forward to its backward: what autograd saved, and the stage's outputs and
   inputs (``fwd_cache[mb]``); the last stage also keeps each output to the step's end
   (``output_chunks``) and concatenates them there (``_merge_outputs``), and each loss;
4. a backward's input gradients go to the stage before (its ``val.grad`` set to None once
   read, ``stage_backward``): held by the send until the schedule waits on it (GPipe: after
   every backward; 1F1B: after the next backward);
5. a stage under FSDP2 (`exportflops.parallel.pipeline.composed_memory`) runs each backward
   without gradient sync or reshard (``backward_maybe_with_nosync``): its unsharded
   gradients accumulate to the step's end, where each unit reduce-scatters them
   (``perform_reduce_grad``), before ``scale_grads``.

So with ``A`` the bytes a microbatch keeps from its forward to its backward, a rank's peak is
its state, its buffers, and ``k A`` plus one microbatch's own peak above what it keeps, where
``k`` is the most microbatches in flight: GPipe runs every forward before any backward
(``k = M``), 1F1B stage s runs ``min(M, P - s)`` warm-up forwards, then one backward and one
forward (``k = min(M, P - s)``), and the interleaved schedules' ``k`` is read from torch's order
as the replay walks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...capture.pipeline_split import Stage, split_stages
from ...checkpointing import Blocks, held_blocks, wrap_plan
from ...errors import InputError, LayoutError
from ...records.memory import MemoryReport
from ...torch_internals import fsdp_reduce_gradients, fsdp_shards, pytree
from ..layout import Layout
from ..per_rank import Builder, built_model
from .analysis import layer_split_points
from .schedules import SCHEDULES, pipeline_order, stages_per_rank


def pipeline_memory(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None, *,
                    layout: Layout, rank: int, schedule: str, microbatches: int | None,
                    mode: str, checkpoint: Blocks | None = None, **options) -> MemoryReport:
    """The `MemoryReport` of pipeline rank ``rank`` of ``model`` split into ``layout.pp``
    stages of whole layers (two per rank under a looped schedule), ``args``/``kwargs`` one
    microbatch, one step of ``microbatches`` (default ``layout.pp``) under ``schedule``;
    ``checkpoint``'s blocks (`Blocks` or a `FitPlan`) wrapped in the stages that hold them
    (`_checkpoint_stages`); ``options``: `replayed`'s (the optimizer, the allocator, the
    loss)."""
    from ...count.ranks import fake_copy

    built, args, kwargs = built_model(model, args, kwargs)
    name = type(built).__name__
    per_rank, order = rank_order(layout, rank, schedule, microbatches, mode, name)
    points = layer_split_points(built, layout.pp * per_rank)
    split = split_stages(built, tuple(args), kwargs, points, grad=mode == "train")
    held = sorted({s for s, _, _ in order})
    rank_model = torch.nn.ModuleDict({f"stage{s}": split[s].module for s in held})
    fake_model, fake_args, fake_kwargs = fake_copy(
        rank_model, tuple(split[s].args for s in held),
        {s: split[s].kwargs for s in held if split[s].kwargs})
    if checkpoint is not None:
        _checkpoint_stages(fake_model, split, held, checkpoint, layout=layout, points=points,
                           name=name)
    stages = {s: Stage(fake_model[f"stage{s}"], fake_args[i], fake_kwargs.get(s),
                       split[s].sources) for i, s in enumerate(held)}
    return replayed(fake_model, stages, order, last=len(split) - 1, name=name, layout=layout,
                    rank=rank, schedule=schedule, mode=mode, **options)


def rank_order(layout: Layout, rank: int, schedule: str, microbatches: int | None, mode: str,
               name: str) -> tuple[int, list[tuple[int, str, int]]]:
    """(stages per rank, [(stage, action, microbatch), ...]) of pipeline rank ``rank``'s step
    of ``microbatches`` (default ``layout.pp``) under ``schedule`` (of model ``name``): its
    forwards only for ``mode="forward"`` (torch's eval(), in the schedule's order)."""
    per_rank = _stages_per_rank(schedule, name)
    m = layout.pp if microbatches is None else microbatches
    order = (one_f_one_b(layout.pp, rank, m) if schedule == "1f1b"
             else pipeline_order(schedule, layout.pp, m, per_rank)[rank])
    if mode == "forward":
        order = [(s, "F", mb) for s, kind, mb in order if kind == "F"]
    return per_rank, order


def replayed(fake_model: torch.nn.ModuleDict, stages: dict[int, Stage],
             order: list[tuple[int, str, int]], *, last: int, name: str, layout: Layout,
             rank: int, schedule: str, mode: str, optimizer: str, allocator: str,
             optimizer_options: dict | None, loss,
             resized: Callable[[], list[torch.Tensor]] | None = None) -> MemoryReport:
    """The `MemoryReport` of rank ``rank``'s step: ``order`` run on its ``stages`` (those of
    ``fake_model``, the rank's fake stage modules; ``last`` the pipeline's last stage) as
    torch's runtime holds them (`_Runtime`), under `exportflops.memory`'s step (``mode``,
    ``optimizer``, ``allocator``, ``optimizer_options``, ``loss``; ``resized``: as
    `run_fake` takes it)."""
    from ...footprint import ALLOCATORS, default_loss, run_fake
    from ...footprint.report import memory_report

    microbatches = len({mb for _, _, mb in order})
    runtime = _Runtime(stages, microbatches, last=last, loss=loss or default_loss(name),
                       schedule=schedule)
    run = run_fake(fake_model, (), {}, name=name, train=mode == "train", optimizer=optimizer,
                   optimizer_options=optimizer_options, loss=runtime.loss, resized=resized,
                   replay=lambda storages: runtime.step(storages, order))
    return memory_report(run, fake_model, mode=mode,
                         optimizer=optimizer if mode == "train" else "",
                         allocator=allocator, size=ALLOCATORS[allocator], name=name,
                         world_size=layout.world_size, rank=rank)


def _checkpoint_stages(rank_model: torch.nn.ModuleDict, split: list[Stage], held: list[int],
                       plan: Blocks, *, layout: Layout, points: list[str], name: str) -> None:
    """The rank's stages (``rank_model["stage<s>"]``, a copy of ``split[s]``, for each of
    ``held``; the split made before each of ``points``) with the blocks of ``plan`` each holds
    wrapped. A stage keeps the model's module paths and runs a block it calls whole as that
    submodule (``call_module`` in its graph), so wrapping the submodule checkpoints the block;
    a block the split inlined, or split over two stages, is in no stage's calls, and wrapping
    it would change nothing: refused."""
    for path in [*plan.checkpointed, *plan.selective]:
        if not any(_calls(stage.module, path) for stage in split):
            raise LayoutError(
                f"{layout}: {name}'s block {path!r} is not a module any pipeline stage calls "
                f"whole (torch's pipeline() split before {', '.join(points)}), so "
                f"checkpointing it there changes nothing: checkpoint blocks that are whole "
                f"layers of one stage (exportflops.planner.block_paths), or plan without pp.")
    for s in held:
        wrap_plan(rank_model[f"stage{s}"], held_blocks(plan, split[s].module), name=name)


def _calls(stage: torch.nn.Module, path: str) -> bool:
    """Whether a graph of ``stage`` (its own, or one of its submodules') calls the module at
    ``path`` as a module."""
    parts = path.split(".")
    for cut in range(len(parts)):
        owner = ".".join(parts[:cut])
        try:
            graph = getattr(stage.get_submodule(owner), "graph", None)
        except AttributeError:
            return False
        rest = ".".join(parts[cut:])
        if isinstance(graph, torch.fx.Graph) and any(
                node.op == "call_module" and node.target == rest for node in graph.nodes):
            return True
    return False


def one_f_one_b(pp: int, stage: int, microbatches: int) -> list[tuple[int, str, int]]:
    """[(stage, action, microbatch), ...] as ``Schedule1F1B._step_microbatches`` runs them on
    ``stage`` (torch/distributed/pipelining/schedules.py): ``min(M, pp - stage)`` warm-up
    forwards, then one backward and one forward while forwards remain, then the backwards
    left. Not the order the timeline uses (`SCHEDULES`: ScheduleInterleaved1F1B's generator
    with one stage per rank, whose warm-up on stage s is ``2 (pp - 1 - s) + 1``, one more
    microbatch in flight on the first stage of two): the timeline's order agrees on when each
    stage computes, not on what ``Schedule1F1B`` holds."""
    warmup = min(microbatches, pp - stage)
    order = [(stage, "F", mb) for mb in range(warmup)]
    for mb in range(microbatches - warmup):
        order += [(stage, "B", mb), (stage, "F", warmup + mb)]
    return order + [(stage, "B", mb) for mb in range(microbatches - warmup, microbatches)]


def _stages_per_rank(schedule: str, name: str) -> int:
    if schedule not in SCHEDULES:
        raise InputError(f"schedule {schedule!r} for {name}: the schedules are "
                         f"{', '.join(SCHEDULES)} (docs/pipeline.md).")
    if SCHEDULES[schedule].split_backward:
        raise InputError(f"schedule {schedule!r} for {name}: memory_ranks replays schedules "
                         f"whose backward is one action (gpipe, 1f1b, interleaved1f1b, "
                         f"loopedbfs); the zero-bubble schedules' split backward is not "
                         f"modelled yet.")
    return stages_per_rank(schedule)


class _Runtime:
    """What torch's stages and schedule hold of a rank's step (module docstring, 1-5)."""

    def __init__(self, stages: dict[int, Stage], microbatches: int, *, last: int,
                 loss: Callable[[Any], torch.Tensor], schedule: str) -> None:
        self.stages, self.microbatches, self.last = stages, microbatches, last
        self.loss, self.schedule = loss, schedule
        # 2. made once, kept from step to step (torch makes them before the first step)
        self.received = {s: [_like(stage.args) for _ in range(microbatches)]
                         for s, stage in stages.items()}
        self.gradients: dict[tuple[int, int], tuple] = {}
        self.outputs: list[Any] = []

    def held(self) -> list[torch.Tensor]:
        """The receive buffers (and the first stage's batch), made before the step."""
        return [t for t in pytree.tree_leaves((self.received, self.gradients))
                if isinstance(t, torch.Tensor)]

    def step(self, storages, order: list[tuple[int, str, int]]) -> None:
        """One step of the rank's ``order``; ``storages``: the recorder, or None (step 1)."""
        from ...footprint.step import BEFORE

        self.outputs = []  # clear_runtime_states: the last step's outputs go at its start
        for tensor in self.held() if storages is not None else ():
            storages.hold(tensor, "inputs", BEFORE)
        backwards = any(kind == "B" for _, kind, _ in order)
        if storages is not None and not backwards:
            self._hold_shards(storages)
        in_flight: dict[tuple[int, int], tuple] = {}
        losses: dict[int, torch.Tensor] = {}
        sends = _Sends(self.schedule, order)
        for s, kind, mb in order:
            if storages is not None:
                storages.phase = "forward" if kind == "F" else "backward"
            if kind == "F":
                in_flight[s, mb] = self._forward(s, mb, losses)
                sends.forward(in_flight[s, mb][0] if s != self.last else ())
            else:
                sends.backward(self._backward(s, mb, in_flight.pop((s, mb)), losses))
                if storages is not None and _sharded(self.stages[s].module):
                    _unsharded_gradients(storages, self.stages[s].module)
        del sends  # the schedule's _step_microbatches returns
        if self.outputs:  # the last stage's step() returns every output, concatenated
            merged = torch.cat(self.outputs)
            del merged
        for stage in self.stages.values() if backwards else ():  # perform_reduce_grad
            if _sharded(stage.module):
                fsdp_reduce_gradients(stage.module)
        for stage in self.stages.values():  # scale_grads: the sum over microbatches / M
            for parameter in stage.module.parameters():
                if parameter.grad is not None:
                    parameter.grad.div_(self.microbatches)

    def _hold_shards(self, storages) -> None:
        """The FSDP2 shards of a step of forwards alone: each unit stays gathered from the
        first step on (nothing reshards it), its unsharded parameters the module's, and its
        shards held by FSDP2 (``sharded_param``)."""
        from ...footprint.step import BEFORE

        for stage in self.stages.values():
            for unit in filter(_sharded, stage.module.modules()):
                for shard in fsdp_shards(unit):
                    storages.hold(shard, "parameters", BEFORE)

    def _forward(self, s: int, mb: int, losses: dict) -> tuple:
        stage = self.stages[s]
        inputs = self.received[s][mb]
        output = stage.module(*inputs, **(stage.kwargs or {}))
        outputs = output if isinstance(output, tuple) else (output,)
        if s == self.last:
            self.outputs.append(output)
            if torch.is_grad_enabled():  # mode="forward" runs torch's eval(): no loss
                losses[mb] = self.loss(output)
        elif (s, mb) not in self.gradients:  # 2. made before the first step in torch
            self.gradients[s, mb] = tuple(torch.empty_like(t) for t in outputs
                                          if isinstance(t, torch.Tensor) and t.requires_grad)
        return outputs, inputs

    def _backward(self, s: int, mb: int, cached: tuple, losses: dict) -> tuple:
        outputs, inputs = cached
        module = self.stages[s].module
        if _sharded(module):  # backward_maybe_with_nosync: reduced at the end
            module.set_is_last_backward(False)
            module.set_reshard_after_backward(False)
            module.set_requires_gradient_sync(False)
        if s == self.last:
            torch.autograd.backward([losses[mb]])
        else:
            torch.autograd.backward([t for t in outputs if isinstance(t, torch.Tensor)
                                     and t.requires_grad], grad_tensors=self.gradients[s, mb])
        sent = tuple(t.grad for t in inputs if isinstance(t, torch.Tensor))
        for t in inputs:  # stage_backward: the stage before gets it; no accumulation here
            if isinstance(t, torch.Tensor):
                t.grad = None
        return sent


class _Sends:
    """The tensors a rank has sent that the schedule still holds (module docstring, 4): the
    P2P ops and gloo's works keep their tensors, and torch's schedules keep those in
    variables. GPipe keeps every send's works to the end of its microbatches
    (``fwd_sends_to_wait``, ``bwd_sends_to_wait``). 1F1B keeps the last forward's sends
    (``fwd_sends``) and the last backward's (``bwd_sends``, then ``send_work``) until the next
    ones replace them, and the works of the warm-up forwards it fires (all but the last, in
    ``send_work``) until its one-forward-one-backward loop ends, after backward
    ``M - warmup``. The looped schedules' runtime is not followed: a sent tensor is held as
    long as the stage's own caches hold it."""

    def __init__(self, schedule: str, order: list[tuple[int, str, int]]) -> None:
        self.schedule = schedule
        forwards = [mb for _, kind, mb in order if kind == "F"]
        first_backward = next((i for i, (_, kind, _) in enumerate(order) if kind == "B"),
                              len(order))
        self.warmup = first_backward  # 1F1B's warm-up forwards
        self.loop_backwards = len(forwards) - self.warmup + 1
        self.forwards = self.backwards = 0
        self.kept: dict[str, list] = {"all": [], "forward": [], "backward": [], "warmup": []}

    def forward(self, outputs: tuple) -> None:
        if self.schedule == "gpipe":
            self.kept["all"].append(outputs)
        elif self.schedule == "1f1b":
            if self.forwards < self.warmup - 1:
                self.kept["warmup"] = [outputs]
            self.kept["forward"] = [outputs]
        self.forwards += 1

    def backward(self, gradients: tuple) -> None:
        self.backwards += 1
        if self.schedule == "gpipe":
            self.kept["all"].append(gradients)
        elif self.schedule == "1f1b":
            self.kept["backward"] = [gradients]
            if self.backwards == self.loop_backwards:
                self.kept["warmup"] = []


def _unsharded_gradients(storages, module: torch.nn.Module) -> None:
    """The gradients FSDP2 ``module`` accumulates unsharded over the microbatches, recorded as
    gradients: between its backwards (not resharded, ``set_reshard_after_backward(False)``)
    the module's parameters are its unsharded ones, their ``grad`` summed by autograd until
    the step's reduce-scatter frees them (`fsdp_reduce_gradients`)."""
    for parameter in module.parameters():
        if parameter.grad is not None:
            storages.hold(parameter.grad, "gradients", len(storages.run.ops)).kind = "gradients"


def _sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 unit (a stage torch's runtime syncs at the step's end)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _like(args: tuple) -> tuple:
    """A microbatch's buffer for each tensor of ``args``, needing a gradient as it does."""
    return tuple(torch.empty_like(a).requires_grad_(a.requires_grad)
                 if isinstance(a, torch.Tensor) else a for a in args)
