"""One cheap eager run of a model that leaves it as it was.

The fast path's cheap pass (`blocks`) and the search for checkpointed modules
(`checkpointed`) run the user's forward once on meta or fake tensors: nothing is computed, and
what the forward sets on its modules is put back afterwards.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator

import torch

from ..torch_internals import FakeTensorMode, pytree


def cheap_mode(model: torch.nn.Module, args: tuple, kwargs: dict):
    """Plain eager on meta when every tensor is on meta; otherwise fake tensors, so nothing is
    computed and no state changes."""
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))]
    if all(t.device.type == "meta" for t in tensors):
        return contextlib.nullcontext()
    return FakeTensorMode(allow_non_fake_inputs=True)


#: A module's parameters, buffers and children: the model's structure, which a forward does not
#: change (a lazy module's first call does, and keeps it).
_STRUCTURE = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
#: A module's hook dicts: every other attribute an nn.Module is made with.
_HOOKS = frozenset(torch.nn.Module().__dict__) - _STRUCTURE - {"training"}


def _holds_tensors(container: dict | list | set) -> bool:
    values = container.values() if isinstance(container, dict) else container
    return any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(list(values)))


@contextlib.contextmanager
def attributes_kept(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Each module's attributes as they were before the block (of a model's ``modules()``, or
    the originals of the fast path's copies): one its forward sets (a call counter, a tensor
    cached on the first call) is put back, one it adds removed. The cheap
    pass's tensors are meta or fake and must not stay on the user's modules; torch.export puts
    back what its own run assigns too (``_detect_attribute_assignment``), so the fast path
    leaves the model as the full export does."""
    kept = [(module, dict(module.__dict__)) for module in modules]
    # A container the forward fills in place keeps its identity, so its contents are put back
    # where the pass left its tensors in it (LeViT's attention-bias cache, a dict), and a
    # module's hooks always: transformers installs hooks on a first call and sets a flag that
    # says so, and the flag removed without the hooks installs them twice.
    # Most are empty hook dicts (a dozen per module): their contents are no copy (a copy of
    # each was a tenth of the cheap pass over Llama-3-70B's 965 modules).
    contents = [(value, copy.copy(value) if value else (), name in _HOOKS)
                for _, attributes in kept for name, value in attributes.items()
                if name not in _STRUCTURE and isinstance(value, (dict, list, set))]
    try:
        yield
    finally:
        for module, attributes in kept:
            for name in module.__dict__.keys() - attributes.keys():
                del module.__dict__[name]
            for name, value in attributes.items():
                if module.__dict__.get(name, _ABSENT) is not value:
                    module.__dict__[name] = value
        for container, before, hooks in contents:
            if (before or container) and (hooks or _holds_tensors(container)):
                container.clear()
                (container.extend if isinstance(container, list) else container.update)(before)


#: An attribute a module does not have (None is a value).
_ABSENT = object()
