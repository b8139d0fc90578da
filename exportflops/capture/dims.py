"""Dynamic sizes named by the user: ``name -> (positional input, dim)`` made into the
``dynamic_shapes`` torch.export takes, keyed by forward's own argument names."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..errors import InputError

#: Where the sizes named ``batch`` and ``seq`` are, as (positional input, dim): a model's
#: first input is (batch, seq) token ids or a batch of features.
NAMED_DIMS = {"batch": (0, 0), "seq": (0, 1)}


def dynamic_shapes(model: torch.nn.Module, args: tuple, kwargs: dict,
                   dims: dict[str, tuple[int, int]], maxima: dict[str, int]) -> dict:
    """``dynamic_shapes`` by forward's argument names: each of ``dims``, ``name -> (arg,
    dim)``, becomes a ``torch.export.Dim`` of that name (bounded by ``maxima`` where it gives
    one). A place that is no tensor's dim is an `InputError` naming the size."""
    bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    names = list(bound)
    spec: dict[str, Any] = {name: None for name in names}
    for size_name, (position, dim) in dims.items():
        if position >= len(args) or not isinstance(args[position], torch.Tensor):
            raise InputError(f"dims={{{size_name!r}: ({position}, {dim})}}: forward's "
                             f"positional argument {position} is not a tensor input of "
                             f"{type(model).__name__}.")
        tensor = args[position]
        if not -tensor.ndim <= dim < tensor.ndim:
            raise InputError(f"dims={{{size_name!r}: ({position}, {dim})}}: argument "
                             f"{position} has shape {list(tensor.shape)}, no dim {dim}.")
        entry = spec[names[position]] or {}
        entry[dim % tensor.ndim] = torch.export.Dim(size_name, max=maxima.get(size_name))
        spec[names[position]] = entry
    return spec
