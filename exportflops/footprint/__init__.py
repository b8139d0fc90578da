"""Memory: where the bytes of one step go (`memory`, the record `MemoryReport`).

``step`` runs the step on a fake copy of the model and records every storage's lifetime;
``liveness`` sweeps those lifetimes into the live bytes by kind at every op; ``report`` builds
the record (peak, kinds, module tree, timeline). Definitions: docs/memory.md.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from .cpu_outputs import AsOnCpu
from .liveness import cuda_blocks, exact
from .report import memory_report
from .step import run_step, StepRun
from ..errors import InputError, ProfileError
from ..records.memory import MemoryReport
from ..torch_internals import pytree, require

#: The optimizers a training step can run, by name (their defaults: the state they allocate
#: does not depend on the learning rate).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
ALLOCATORS: dict[str, Callable[[int], int]] = {"exact": exact, "cuda": cuda_blocks}


def memory(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
           mode: str = "train", optimizer: str = "adamw", allocator: str = "exact",
           optimizer_options: dict | None = None,
           loss: Callable[[Any], torch.Tensor] | None = None) -> MemoryReport:
    """The memory of one step of ``model`` on ``args``/``kwargs``: its peak, what holds it, per
    module, and the live bytes at every op.

    ``mode="train"``: step 2 of a loop of forward, ``loss``, backward, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``, so the optimizer's states exist and gradients
    start at none; ``mode="forward"``: one forward under no_grad. ``optimizer``: ``adamw``,
    ``adam`` or ``sgd`` (``optimizer_options={"momentum": 0.9}`` for its momentum buffer),
    built with ``optimizer_options``. ``loss``: output -> scalar; by default the output's
    ``.loss`` (a Hugging Face model given labels), else the sum of every floating output that
    needs a gradient. ``allocator="cuda"`` rounds each storage up to the CUDA caching
    allocator's 512-byte blocks. Nothing is computed: the step runs on a fake copy of the model
    and its inputs (meta models too); the model is untouched.
    """
    name = type(model).__name__
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"memory() takes a torch.nn.Module, not {name}.")
    check_options(name, mode, optimizer, allocator)
    train = mode == "train"
    run = _run(model, tuple(args), dict(kwargs or {}), name=name, train=train,
               optimizer=optimizer, optimizer_options=optimizer_options,
               loss=loss or default_loss(name))
    return memory_report(run, model, mode=mode, optimizer=optimizer if train else "",
                         allocator=allocator, size=ALLOCATORS[allocator])


def _run(model: torch.nn.Module, args: tuple, kwargs: dict, *, name: str, train: bool,
         optimizer: str, optimizer_options: dict | None,
         loss: Callable[[Any], torch.Tensor]) -> StepRun:
    """The step on a fake copy of ``model`` and its inputs."""
    # Imported here: the parallel package loads every per-rank analysis, which memory needs not.
    from ..count.ranks import fake_copy

    return run_fake(*fake_copy(model, args, kwargs), name=name, train=train,
                    optimizer=optimizer, optimizer_options=optimizer_options, loss=loss)


def run_fake(fake_model: torch.nn.Module, fake_args: tuple, fake_kwargs: dict, *, name: str,
             train: bool, optimizer: str, optimizer_options: dict | None,
             loss: Callable[[Any], torch.Tensor],
             resized: Callable[[], list[torch.Tensor]] | None = None,
             replay: Callable[[Any], None] | None = None) -> StepRun:
    """The step of ``fake_model`` (and its inputs) on fake tensors, under their fake mode;
    ``resized``, ``replay``: as `run_step` takes them."""
    with _fake_mode_of(fake_model, fake_args, fake_kwargs), AsOnCpu():
        built = _optimizer(optimizer, optimizer_options, fake_model, name) if train else None
        try:
            return run_step(fake_model, fake_args, fake_kwargs, train=train, optimizer=built,
                            loss=loss, resized=resized, replay=replay)
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
    return require("detect_fake_mode")([
        t for t in (*fake_model.parameters(), *fake_model.buffers(),
                    *pytree.tree_leaves((fake_args, fake_kwargs))) if isinstance(t, torch.Tensor)])


def check_options(name: str, mode: str, optimizer: str, allocator: str) -> None:
    """The step's options for model ``name``, checked before anything runs."""
    if mode not in ("train", "forward"):
        raise InputError(f"mode={mode!r} for {name}: memory() runs mode='train' (a training "
                         f"step) or mode='forward' (a forward under no_grad).")
    if mode == "train" and optimizer not in OPTIMIZERS:
        raise InputError(f"optimizer={optimizer!r} for {name}: memory() knows "
                         f"{', '.join(sorted(OPTIMIZERS))}.")
    if allocator not in ALLOCATORS:
        raise InputError(f"allocator={allocator!r} for {name}: choose 'exact' (storage bytes) "
                         f"or 'cuda' (the CUDA caching allocator's 512-byte blocks).")


def _optimizer(optimizer: str, options: dict | None, model: torch.nn.Module,
               name: str) -> torch.optim.Optimizer:
    kind = OPTIMIZERS[optimizer]
    try:
        return kind(model.parameters(), **(options or {}))
    except (TypeError, ValueError) as error:
        raise InputError(f"optimizer_options={options!r} for {name}: torch.optim."
                         f"{kind.__name__} refuses them: {error}") from None


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
