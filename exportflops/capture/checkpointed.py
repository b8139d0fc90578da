"""Which modules run inside non-reentrant activation checkpointing.

torch.export inlines ``torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False)`` (and
``checkpoint_wrapper``, torchtitan's and transformers' gradient checkpointing in that mode):
the graph keeps no mark of the region whose forward the backward reruns. The checkpoint is a
saved-tensor hook autograd holds while the region runs, so one cheap eager run (meta, or fake
tensors: nothing computed) asks autograd at each module call whether such a hook is active.
"""

from __future__ import annotations

import torch

from ..records.names import ancestors
from ..torch_internals import require
from .cheap_run import attributes_kept, cheap_mode
from .quiet import quiet_fake_tensor_log

#: The qualified name torch gives the pack hook of a non-reentrant checkpoint
#: (torch/utils/checkpoint.py, class ``_checkpoint_hook``).
CHECKPOINT_HOOK = "_checkpoint_hook."


def checkpointed_modules(model: torch.nn.Module, args: tuple,
                         kwargs: dict) -> frozenset[str] | None:
    """The outermost module paths whose calls run inside a non-reentrant checkpoint (empty
    where none does); None where the eager run fails, which a traceable model can: its
    forward may take another branch when traced (transformers' MoE experts call
    ``torch._grouped_mm``, whose fake-tensor kernel refuses float32, only in eager)."""
    top_hooks = require("top_saved_tensors_hooks")
    paths = {id(module): path for path, module in model.named_modules()}
    found: set[str] = set()

    def inside(module, _args):
        hooks = top_hooks(True)
        if hooks is not None and CHECKPOINT_HOOK in getattr(hooks[0], "__qualname__", ""):
            found.add(paths.get(id(module), ""))

    handles = [module.register_forward_pre_hook(inside) for module in model.modules()]
    try:
        with quiet_fake_tensor_log(), cheap_mode(model, args, kwargs), \
                attributes_kept(model.modules()), torch.random.fork_rng(devices=[]), \
                torch.enable_grad():
            model(*args, **kwargs)
    except Exception:  # noqa: BLE001 - unknown, not none: the caller asks the trace
        return None
    finally:
        for handle in handles:
            handle.remove()
    return frozenset(p for p in found if not any(a in found for a in ancestors(p)[:-1]))
