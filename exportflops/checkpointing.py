"""Wrapping blocks in activation checkpointing, for good (`FitPlan.apply`) or for one
measurement of the fit planner (`wrapped`, which puts the blocks back, also on error). A module
of its own, importing no record, so that `FitPlan.apply` reaches it without an import cycle."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, CheckpointWrapper, checkpoint_wrapper)

from .errors import InputError


def wrap_blocks(model: torch.nn.Module, paths: list[str], *, name: str) -> torch.nn.Module:
    """``model`` with each block at ``paths`` replaced, in place, by torch's reentrant
    ``checkpoint_wrapper`` around it. Reentrant: `exportflops.analyze` counts a reentrant
    region's recompute (a non-reentrant one's it does not see yet), and the wrapper keeps the
    state dict's keys (its hooks strip ``_checkpoint_wrapped_module.``)."""
    parents = [_parent(model, path, name) for path in paths]
    for path, (parent, child) in zip(paths, parents):
        block = parent.get_submodule(child)
        if isinstance(block, CheckpointWrapper) or isinstance(parent, CheckpointWrapper):
            raise InputError(f"{path!r} of {name} is already checkpointed: a plan applies "
                             f"once; apply it to a fresh model.")
    for (parent, child) in parents:
        setattr(parent, child, checkpoint_wrapper(parent.get_submodule(child),
                                                  checkpoint_impl=CheckpointImpl.REENTRANT))
    return model


@contextlib.contextmanager
def wrapped(model: torch.nn.Module, paths: list[str]) -> Iterator[torch.nn.Module]:
    """``model`` with the blocks at ``paths`` checkpointed while the block runs; the blocks
    are put back on exit."""
    name = type(model).__name__
    parents = [_parent(model, path, name) for path in paths]
    blocks = [parent.get_submodule(child) for parent, child in parents]
    try:
        yield wrap_blocks(model, paths, name=name)
    finally:
        for (parent, child), block in zip(parents, blocks):
            setattr(parent, child, block)


def _parent(model: torch.nn.Module, path: str, name: str) -> tuple[torch.nn.Module, str]:
    parent_path, _, child = path.rpartition(".")
    try:
        parent = model.get_submodule(parent_path)
        parent.get_submodule(child)
    except AttributeError:
        raise InputError(f"{name} has no module {path!r} to checkpoint: the plan was made for "
                         f"another model's structure.") from None
    return parent, child
