"""What a call's inputs hold: every tensor inside them, in whatever object it sits.

Inputs are more than pytree's containers: transformers' ``DynamicCache`` holds its keys and
values as attributes of its layer objects, and it is a pytree node only while its export
support is registered. ``tensors_in`` finds every tensor the way ``copy.deepcopy`` reaches
one (a list's items, a dict's keys and values, any other object's attributes and slots), and
``copied`` copies just the objects on the way to a tensor, with each tensor replaced: a fake
copy of a user's filled cache that leaves the user's cache as it was.
"""

from __future__ import annotations

import copy
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

# What deepcopy keeps as it is (copy._deepcopy_atomic): none of these holds a tensor.
_ATOMIC = (type(None), int, float, bool, complex, str, bytes, range, type, types.CodeType,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
           weakref.ref, property, torch.dtype, torch.device, torch.layout, torch.memory_format)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor ``value`` holds, each once, in the order reached."""
    tensors: dict[int, torch.Tensor] = {}
    _walk(value, tensors, {})
    return list(tensors.values())


def copied(value: Any, tensor: Callable[[torch.Tensor], Any], memo: dict | None = None) -> Any:
    """``value`` with each tensor it holds replaced by ``tensor(t)`` (called once per tensor;
    the same tensor twice gives the same replacement twice). Only the lists, dicts and objects
    on the way to a tensor are copied; ``value`` itself is unchanged, and whatever holds no
    tensor is shared with it. ``memo``: ``copy.deepcopy``'s, for objects replaced already (a
    model's parameters an input also holds)."""
    memo = {} if memo is None else memo
    tensors: dict[int, torch.Tensor] = {}
    holds: dict[int, tuple[Any, bool]] = {}
    _walk(value, tensors, holds)
    for key, t in tensors.items():
        if key not in memo:
            memo[key] = tensor(t)
    for key, (held, holds_a_tensor) in holds.items():
        if not holds_a_tensor and key not in memo:
            memo[key] = held
    return copy.deepcopy(value, memo)


def _walk(value: Any, tensors: dict[int, torch.Tensor],
          holds: dict[int, tuple[Any, bool]]) -> bool:
    """Whether ``value`` holds a tensor; each tensor found goes in ``tensors`` and each object
    walked in ``holds`` (by id), with whether it holds one."""
    key = id(value)
    if isinstance(value, torch.Tensor):
        tensors.setdefault(key, value)
        return True
    if key in holds:
        return holds[key][1]
    if isinstance(value, _ATOMIC):
        return False
    # Reached again while walked (a cycle): taken to hold one, so that it is copied with the
    # object it leads back to rather than shared with the user's.
    holds[key] = (value, True)
    found = False
    for child in _children(value):
        found = _walk(child, tensors, holds) or found
    holds[key] = (value, found)
    return found


def _children(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        yield from value.keys()
        yield from value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from value
    yield from getattr(value, "__dict__", {}).values()
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):  # stored name-mangled
                slot = f"_{cls.__name__.lstrip('_')}{slot}"
            if hasattr(value, slot):
                yield getattr(value, slot)
