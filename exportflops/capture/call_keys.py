"""The keys the fast path's cheap pass compares module calls and ATen ops by (`blocks`): each
tensor by its shape, stride, dtype, device and ``requires_grad``, each plain value by its type
and itself, the structure by pytree's spec; any other leaf makes a call `Unique`."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..torch_internals import pytree

#: Leaves compared by value; any other object as an input or output makes a call unique.
PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)
#: The same types, matched exactly (`op_key`'s first test).
EXACT_PLAIN = frozenset(PLAIN)


class Unique(Exception):
    """A value that makes a call incomparable with any other."""


#: Types pytree takes as leaves that module calls pass most: a call made of them alone is
#: flattened without pytree's walk (`flattened_call`).
LEAF_TYPES = EXACT_PLAIN | {torch.Tensor, torch.nn.Parameter}


def flattened_call(args: tuple, kwargs: dict) -> tuple[list, pytree.TreeSpec]:
    """``pytree.tree_flatten((args, kwargs))``; for positional leaves alone (most module calls)
    the spec is made once per count, and calls with it share one object, which `_choose`'s
    comparisons find equal by identity."""
    if not kwargs and all(type(a) in LEAF_TYPES for a in args):
        return list(args), _positional_spec(len(args))
    return pytree.tree_flatten((args, kwargs))


def flattened_output(output: Any) -> tuple[list, pytree.TreeSpec]:
    """``pytree.tree_flatten(output)``; a lone tensor's spec made once (`flattened_call`)."""
    if type(output) in LEAF_TYPES:
        return [output], _LEAF_SPEC
    return pytree.tree_flatten(output)


def leaves(tree: Any) -> list:
    """``pytree.tree_leaves(tree)``; a leaf, or a tuple, list or dict of leaves alone (most
    calls' arguments and results), without pytree's walk (a sixth of the cheap pass over
    GPT-2 was it; `flattened_call` likewise, with the spec)."""
    kind = type(tree)
    if kind in LEAF_TYPES:
        return [tree]
    values = tree.values() if kind is dict else tree if kind in (tuple, list) else None
    if values is not None and all(type(v) in LEAF_TYPES for v in values):
        return list(values)
    return pytree.tree_leaves(tree)


@functools.cache
def _positional_spec(count: int) -> pytree.TreeSpec:
    return pytree.tree_flatten((tuple(range(count)), {}))[1]


_LEAF_SPEC = pytree.tree_flatten(0)[1]


def flat_key(leaves: list, spec: pytree.TreeSpec) -> tuple:
    """A flattened pytree's structure and each leaf's `leaf_key`."""
    return (spec, *(leaf_key(leaf) for leaf in leaves))


def op_key(value: Any) -> Any:
    """`flat_key` for an ATen op's arguments and results, which are tensors, plain values and lists,
    tuples or dicts of them: a nested tuple, without pytree's specs. The cheap pass's cost is
    mostly this, once per op, so the commonest leaves go first by exact type (a subclass takes
    the general way, to the same key), and a tensor's shape stays a ``torch.Size`` (equal to
    the tuple `leaf_key` makes, with the same hash)."""
    kind = type(value)
    if kind in EXACT_PLAIN:
        return kind, value
    if kind is tuple or kind is list:  # a size's ints keyed here, without a call each
        return (kind, *[(type(v), v) if type(v) in EXACT_PLAIN else op_key(v) for v in value])
    if isinstance(value, torch.Tensor):
        return value.shape, value.stride(), value.dtype, value.device, value.requires_grad
    if isinstance(value, (list, tuple)):
        return (kind, *map(op_key, value))
    if isinstance(value, dict):
        return (dict, *[(k, op_key(v)) for k, v in value.items()])
    return leaf_key(value)


def leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return (tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad)
    if isinstance(leaf, PLAIN):
        return (type(leaf), leaf)
    raise Unique
