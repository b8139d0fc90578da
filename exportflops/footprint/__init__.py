"""Memory: where the bytes of one step go (`memory`, the record `MemoryReport`).

``step`` runs the step on a fake copy of the model and records every storage's lifetime (and,
from ``workspaces``, the bytes a cpu kernel holds inside itself at its op); ``liveness``
sweeps those lifetimes into the live bytes by kind at every op; ``report`` builds the record
(peak, kinds, module tree, timeline). Definitions: docs/memory.md.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from .cpu_outputs import AsOnCpu
from .liveness import cuda_blocks, exact
from .optimizers import (build_optimizer, forward_context, in_precision, optimizer_name,
                         OPTIMIZERS, PRECISIONS, Rebuilt, rebuilt)
from .report import memory_report
from .step import run_step, StepRun
from .symbolic import symbolic_memory
from ..capture.held import tensors_in
from ..errors import InputError, ProfileError
from ..records.memory import MemoryReport
from ..records.symbolic_memory import SymbolicMemoryReport
from ..torch_internals import pytree, require

ALLOCATORS: dict[str, Callable[[int], int]] = {"exact": exact, "cuda": cuda_blocks}


def memory(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
           mode: str = "train", optimizer: str | torch.optim.Optimizer = "adamw",
           allocator: str = "exact", optimizer_options: dict | None = None,
           precision: str = "32-true",
           loss: Callable[[Any], torch.Tensor] | None = None,
           dynamic_shapes: Any = None) -> MemoryReport | SymbolicMemoryReport:
    """The memory of one step of ``model`` on ``args``/``kwargs``: its peak, what holds it, per
    module, and the live bytes at every op.

    ``mode="train"``: step 2 of a loop of forward, ``loss``, backward, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``, so the optimizer's states exist and gradients
    start at none; ``mode="forward"``: one forward under no_grad. ``optimizer``: ``adamw``,
    ``adam``, ``sgd`` (``optimizer_options={"momentum": 0.9}`` for its momentum buffer),
    ``adagrad`` or ``rmsprop``, built with ``optimizer_options``; or a
    ``torch.optim.Optimizer`` over ``model``'s parameters, whose class and param_groups'
    hyperparameters are rebuilt over the fake copy (its tensors are not read).
    ``precision``: ``32-true`` (the model's dtypes), ``bf16-mixed`` (autocast to bf16 over
    fp32 parameters, as Lightning's), ``bf16-true`` (everything in bf16) or
    ``bf16-master`` (bf16 parameters, gradients and activations; an fp32 master copy, counted
    as ``optimizer``, and fp32 states: `exportflops.footprint.optimizers`). ``loss``: output
    -> scalar; by default the output's ``.loss`` (a Hugging Face model given labels), else the
    sum of every floating output that needs a gradient. ``allocator="cuda"`` rounds each
    storage up to the CUDA caching allocator's 512-byte blocks. Nothing is computed: the step
    runs on a fake copy of the model and its inputs (meta models too); the model is untouched.

    ``dynamic_shapes`` (``analyze``'s convention: ``{dim: torch.export.Dim(name)}`` per input,
    by forward's argument names or in their order): a `SymbolicMemoryReport`, each kind a
    polynomial in those names, from steps at a few sizes checked at one more
    (`exportflops.footprint.symbolic`; ``allocator="exact"`` only).
    """
    name = type(model).__name__
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"memory() takes a torch.nn.Module, not {name}.")
    check_options(name, mode, optimizer, allocator, precision, instances=True)
    train = mode == "train"
    label = optimizer_name(optimizer) if train else ""
    if isinstance(optimizer, torch.optim.Optimizer):
        optimizer = rebuilt(optimizer, model, name)

    def step(step_args: tuple, step_kwargs: dict) -> StepRun:
        return _run(model, step_args, step_kwargs, name=name, train=train, optimizer=optimizer,
                    optimizer_options=optimizer_options, loss=loss or default_loss(name),
                    precision=precision)

    if dynamic_shapes is not None:
        if allocator != "exact":
            raise InputError(f"allocator={allocator!r} with dynamic_shapes for {name}: the "
                             f"CUDA allocator's rounding is no polynomial in the sizes; use "
                             f"allocator='exact', or memory() at each size.")
        return symbolic_memory(model, tuple(args), dict(kwargs or {}), dynamic_shapes, step,
                               mode=mode, optimizer=label)
    run = step(tuple(args), dict(kwargs or {}))
    return memory_report(run, model, mode=mode, optimizer=label,
                         allocator=allocator, size=ALLOCATORS[allocator])


def _run(model: torch.nn.Module, args: tuple, kwargs: dict, *, name: str, train: bool,
         optimizer: str | Rebuilt, optimizer_options: dict | None,
         loss: Callable[[Any], torch.Tensor], precision: str) -> StepRun:
    """The step on a fake copy of ``model`` and its inputs."""
    # Imported here: the parallel package loads every per-rank analysis, which memory needs not.
    from ..count.ranks import fake_copy

    return run_fake(*fake_copy(model, args, kwargs), name=name, train=train,
                    optimizer=optimizer, optimizer_options=optimizer_options, loss=loss,
                    precision=precision)


def run_fake(fake_model: torch.nn.Module, fake_args: tuple, fake_kwargs: dict, *, name: str,
             train: bool, optimizer: str | Rebuilt, optimizer_options: dict | None,
             loss: Callable[[Any], torch.Tensor],
             resized: Callable[[], list[torch.Tensor]] | None = None,
             replay: Callable[[Any], None] | None = None,
             precision: str = "32-true") -> StepRun:
    """The step of ``fake_model`` (and its inputs) on fake tensors, under their fake mode, in
    ``precision``; ``resized``, ``replay``: as `run_step` takes them."""
    with _fake_mode_of(fake_model, fake_args, fake_kwargs), AsOnCpu():
        fake_model, fake_args, fake_kwargs = in_precision(fake_model, fake_args, fake_kwargs,
                                                          precision)
        built = (build_optimizer(optimizer, optimizer_options, fake_model, name, precision)
                 if train else None)
        try:
            return run_step(fake_model, fake_args, fake_kwargs, train=train, optimizer=built,
                            loss=loss, resized=resized, replay=replay,
                            forward_context=forward_context(precision))
        except (InputError, ProfileError):
            raise
        except Exception as error:  # the user's forward may raise anything on fake tensors
            raise ProfileError(
                f"one {'training step' if train else 'forward'} of {name} on fake tensors "
                f"failed: {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}. A forward that reads "
                f"tensor values (.item(), nonzero: an MoE's eager experts loop; "
                f"transformers' default grouped_mm experts read none) cannot run on fake "
                f"tensors; check the step runs eagerly on these inputs.") from error


def _fake_mode_of(fake_model: torch.nn.Module, fake_args: tuple, fake_kwargs: dict) -> Any:
    """The fake mode of the step's tensors. No list of them outlives this call: a step that
    drops an input (a decode step's cache, replaced by the one it grows into) frees it."""
    return require("detect_fake_mode")([*fake_model.parameters(), *fake_model.buffers(),
                                         *tensors_in((fake_args, fake_kwargs))])


def check_options(name: str, mode: str, optimizer: str | torch.optim.Optimizer,
                  allocator: str, precision: str = "32-true", instances: bool = False) -> None:
    """The step's options for model ``name``, checked before anything runs; ``instances``:
    whether the caller rebuilds a ``torch.optim.Optimizer`` given as ``optimizer``."""
    if mode not in ("train", "forward"):
        raise InputError(f"mode={mode!r} for {name}: memory() runs mode='train' (a training "
                         f"step) or mode='forward' (a forward under no_grad).")
    if isinstance(optimizer, torch.optim.Optimizer) and not instances:
        raise InputError(f"optimizer={type(optimizer).__qualname__} instance for {name}: this "
                         f"analysis takes the optimizer by name, one of "
                         f"{', '.join(sorted(OPTIMIZERS))} (exportflops.memory takes an "
                         f"instance).")
    if mode == "train" and not (isinstance(optimizer, torch.optim.Optimizer)
                                or optimizer in OPTIMIZERS):
        raise InputError(f"optimizer={optimizer!r} for {name}: memory() knows "
                         f"{', '.join(sorted(OPTIMIZERS))}, or takes a torch.optim.Optimizer "
                         f"over the model's parameters.")
    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r} for {name}: memory() knows "
                         f"{', '.join(PRECISIONS)} (docs/memory.md).")
    if allocator not in ALLOCATORS:
        raise InputError(f"allocator={allocator!r} for {name}: choose 'exact' (storage bytes) "
                         f"or 'cuda' (the CUDA caching allocator's 512-byte blocks).")


def default_loss(name: str) -> Callable[[Any], torch.Tensor]:
    def loss(output: Any) -> torch.Tensor:
        given = getattr(output, "loss", None)
        if isinstance(given, torch.Tensor):
            return given
        floats = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)
                  and t.is_floating_point() and t.requires_grad]
        if not floats:
            raise InputError(
                f"{name} returned no floating tensor that needs a gradient, so a training "
                f"step has no loss: pass loss=, or mode='forward'.")
        return functools.reduce(operator.add, (t.sum() for t in floats))
    return loss
