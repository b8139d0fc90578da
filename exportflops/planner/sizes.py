"""The largest batch and sequence length whose step fits a budget, from the step's memory at
symbolic sizes (`exportflops.footprint.symbolic`).

The example's batch is the first dim of its first tensor, and every input tensor whose first
dim has as many rows; its length, where that tensor is token ids (integers, 2 dims or more),
is their second dim, and every input tensor's second dim of that size. A length is bounded by
the model's position table where it has one (`training.checks.position_limit`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.export import Dim

from ..footprint.symbolic import marked_sizes, resized_inputs
from ..errors import InputError
from ..records.symbolic import largest_size
from ..torch_internals import pytree

#: A user's ``resize(batch) -> (args, kwargs)``: the example at ``batch`` rows.
Resize = Callable[[int], tuple[tuple, dict]]
#: Where a search over steps at each size stops doubling.
MOST_ROWS = 2**20
#: memory(args, kwargs, dynamic_shapes) -> the step's `MemoryReport`, or with
#: ``dynamic_shapes`` its `SymbolicMemoryReport`.
MemoryOf = Callable[[tuple, dict, Any], Any]


def example_sizes(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, int]:
    """The example's batch and, for token ids, length (module docstring)."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not tensors:
        return {}
    first = tensors[0]
    sizes = {"batch": first.shape[0]}
    if first.dim() >= 2 and not first.is_floating_point() and not first.is_complex():
        sizes["length"] = first.shape[1]
    return sizes


def largest_sizes(model: torch.nn.Module, args: tuple, kwargs: dict, limit: int,
                  memory_of: MemoryOf, *, symbolic: bool = True,
                  multiples: dict[str, int] | None = None) -> dict[str, int]:
    """For each of `example_sizes`, the largest whose step's peak is at most ``limit`` bytes,
    the other at the example's: from the symbolic memory, sampled from 2; a batch of 1, below
    the samples, run as it is where 2 does not fit. Where the step changes with the size (the
    symbolic memory refuses it), or without ``symbolic`` (a step per rank, which has no symbolic
    memory yet), a search over steps at each size instead, of the sizes that are multiples of
    ``multiples[name]`` where given (a context-parallel ring splits a length it divides)."""
    sizes = example_sizes(model, args, kwargs)
    found = {}
    for name, example in sizes.items():
        shapes = _dynamic_shapes(model, args, kwargs, name, example)
        marks, ranges = marked_sizes(model, args, kwargs, shapes)
        unit = (multiples or {}).get(name, 1)

        def fits(units: int, name: str = name, marks: dict = marks, unit: int = unit) -> bool:
            at = resized_inputs(args, kwargs, marks, {name: units * unit})
            return memory_of(*at, None).peak_bytes <= limit

        largest = None
        if symbolic:
            try:
                largest = memory_of(args, kwargs, shapes).largest(name, limit)
            except InputError:  # the step changes with the size: no polynomial, so run each
                pass
        if largest is None:
            largest = unit * largest_size(fits, 1, (ranges[name].max or MOST_ROWS) // unit)
        found[name] = largest if largest else unit * int(fits(1))
    return found


def _dynamic_shapes(model: torch.nn.Module, args: tuple, kwargs: dict, name: str,
                    example: int) -> dict:
    """``dynamic_shapes`` by forward's argument names, marking dim 0 (batch) or 1 (length) of
    every tensor input of the example's size there."""
    dim = 0 if name == "batch" else 1
    size = Dim(name, max=_positions(model)) if name == "length" else Dim(name)
    bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments

    def spec(leaf: Any) -> dict | None:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > dim and leaf.shape[dim] == example:
            return {dim: size}
        return None

    return {argument: pytree.tree_map(spec, value) for argument, value in bound.items()}


def _positions(model: torch.nn.Module) -> int | None:
    from ..training.checks import position_limit

    limit = position_limit(model)
    return limit[0] if limit is not None else None
