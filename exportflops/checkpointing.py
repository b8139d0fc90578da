"""Wrapping blocks in activation checkpointing, for good (`FitPlan.apply`) or for one
measurement of the fit planner (`wrapped`, which puts the blocks back, also on error). A module
of its own, importing no record, so that `FitPlan.apply` reaches it without an import cycle.

A block is checkpointed whole (torch's reentrant ``checkpoint_wrapper``: its forward reruns in
the backward) or selectively (non-reentrant, with `save_matmuls` as the policy of
``create_selective_checkpoint_contexts``: the matrix products' and attention's outputs are
kept, the rest reruns).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from .errors import InputError
from .torch_internals import CheckpointImpl, CheckpointWrapper, OpOverload, checkpoint_wrapper

_aten = torch.ops.aten
#: The ops whose outputs a selective plan keeps: the matrix products and the attention kernels,
#: the bulk of a block's FLOPs, as torchtitan's op-level selective checkpointing keeps them
#: (torchtitan/distributed/activation_checkpoint.py, ``_save_list``); every other op (norms,
#: activations, residual adds, rotary embeddings) is cheap to rerun.
SAVED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten._grouped_mm.default, _aten._scaled_mm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_fused_attention_overrideable.default,
})


#: The matrix products of libraries' custom ops, by name (such an op exists only once its
#: library registers it): transformers' MoE experts' grouped product where torch's is not
#: used, as under torch.compile and torch.export with weights other than bfloat16
#: (transformers/integrations/moe.py, ``_can_use_grouped_mm``); eager float32 on cpu calls
#: ``aten._grouped_mm``, which `SAVED_OPS` keeps, so a trace reruns what eager reruns.
SAVED_CUSTOM_OPS = frozenset({"transformers::grouped_mm_fallback"})


def save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """The selective plans' policy for ``create_selective_checkpoint_contexts``: keep the
    outputs of `SAVED_OPS` and `SAVED_CUSTOM_OPS`, recompute the rest."""
    saved = op in SAVED_OPS or (isinstance(op, OpOverload)
                                and op.name() in SAVED_CUSTOM_OPS)
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


class Blocks(NamedTuple):
    """The blocks a checkpointing plan wraps, by their paths in the model: whole and
    selectively (`wrap_blocks`). A `FitPlan` has the same two fields, so either is a plan."""

    checkpointed: Sequence[str] = ()
    selective: Sequence[str] = ()


def held_blocks(plan: Blocks, module: torch.nn.Module) -> Blocks:
    """The blocks of ``plan`` (a `Blocks` or a `FitPlan`) that ``module`` holds at the same
    paths: a pipeline stage keeps the model's module paths, and holds its own blocks only."""
    paths = {path for path, _ in module.named_modules()}
    return Blocks([path for path in plan.checkpointed if path in paths],
                  [path for path in plan.selective if path in paths])


def wrap_blocks(model: torch.nn.Module, paths: Sequence[str], *, name: str,
                selective: Sequence[str] = ()) -> torch.nn.Module:
    """``model`` with each block at ``paths`` replaced, in place, by torch's reentrant
    ``checkpoint_wrapper`` around it, and each at ``selective`` by a non-reentrant one whose
    ``context_fn`` is `save_matmuls`'s selective contexts. The wrapper keeps the state dict's
    keys (its hooks strip ``_checkpoint_wrapped_module.``)."""
    parents = [_parent(model, path, name) for path in [*paths, *selective]]
    for path, (parent, child) in zip([*paths, *selective], parents):
        block = parent.get_submodule(child)
        if isinstance(block, CheckpointWrapper) or isinstance(parent, CheckpointWrapper):
            raise InputError(f"{path!r} of {name} is already checkpointed: a plan applies "
                             f"once; apply it to a fresh model.")
    whole = {"checkpoint_impl": CheckpointImpl.REENTRANT}
    some = {"checkpoint_impl": CheckpointImpl.NO_REENTRANT,
            "context_fn": functools.partial(create_selective_checkpoint_contexts, save_matmuls)}
    for index, (parent, child) in enumerate(parents):
        setattr(parent, child, checkpoint_wrapper(parent.get_submodule(child),
                                                  **(whole if index < len(paths) else some)))
    return model


def wrap_plan(model: torch.nn.Module, plan: Blocks, *, name: str) -> torch.nn.Module:
    """``model`` with ``plan``'s blocks (a `Blocks` or a `FitPlan`) wrapped (`wrap_blocks`)."""
    return wrap_blocks(model, plan.checkpointed, name=name, selective=plan.selective)


@contextlib.contextmanager
def wrapped(model: torch.nn.Module, paths: list[str],
            selective: list[str] = ()) -> Iterator[torch.nn.Module]:
    """``model`` with the blocks at ``paths`` checkpointed whole and those at ``selective``
    selectively (`wrap_blocks`) while the block runs; the blocks are put back on exit."""
    name = type(model).__name__
    parents = [_parent(model, path, name) for path in [*paths, *selective]]
    blocks = [parent.get_submodule(child) for parent, child in parents]
    try:
        yield wrap_blocks(model, paths, name=name, selective=selective)
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
