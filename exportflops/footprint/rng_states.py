"""What torch's activation checkpointing keeps of each region besides tensors: the cpu
generator's state. With ``preserve_rng_state`` (its default) both implementations read
``torch.get_rng_state()`` as the region's forward starts (``CheckpointFunction.forward`` and
``_checkpoint_without_reentrant_generator`` in torch/utils/checkpoint.py) and hold it until the
region's backward has run. That tensor is made by the generator, not by an ATen op, so the
step's dispatch mode never sees it: the regions are found here, from module hooks.

A region starts where a module's call runs under a checkpoint's saved-tensors hooks while its
caller's did not (non-reentrant: ``checkpoint(..., use_reentrant=False)``, transformers'
gradient checkpointing, torch's non-reentrant ``CheckpointWrapper``), or at a reentrant
``CheckpointWrapper``. A reentrant ``checkpoint`` called inside a forward by hand is not seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..capture.checkpointed import CHECKPOINT_HOOK
from ..capture.module_hooks import call_hooks
from ..torch_internals import CheckpointImpl, CheckpointWrapper, require


@contextlib.contextmanager
def checkpoint_regions(model: torch.nn.Module, forward: Callable[[], bool],
                       position: Callable[[], int]) -> Iterator[list[tuple[str, int]]]:
    """While the step runs: the (module path, op position) of each checkpoint region its
    forwards enter (``forward()`` true), in order; recomputations in the backward are not
    regions of their own."""
    top_hooks = require("top_saved_tensors_hooks")
    regions: list[tuple[str, int]] = []
    inside: list[bool] = []

    def enter(path: str, module: torch.nn.Module) -> None:
        hooks = top_hooks(True)
        hooked = hooks is not None and CHECKPOINT_HOOK in getattr(hooks[0], "__qualname__", "")
        reentrant = (isinstance(module, CheckpointWrapper)
                     and module.checkpoint_impl == CheckpointImpl.REENTRANT)
        if forward() and not any(inside) and (hooked or reentrant):
            regions.append((path, position()))
        inside.append(hooked or reentrant)

    with call_hooks(model.named_modules(), enter, inside.pop):
        yield regions


def rng_state_bytes() -> int:
    """The bytes of the cpu generator's state, as ``torch.get_rng_state()`` returns it."""
    return torch.get_rng_state().nbytes
