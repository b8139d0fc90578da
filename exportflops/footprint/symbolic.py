"""The memory of a step at symbolic sizes (``memory(..., dynamic_shapes=...)``), as exact
polynomials recovered from concrete fake steps.

Why not one fake step on symbolic sizes: the step is the user's eager code, and its Python
branches on sizes (transformers' mask creation, a ``seq_len == 1`` fast path) would take the
example's side with nothing to check the guard. Each concrete step here is a real fake run,
so a branch that changes the step is seen, never assumed away. What it is (docs/memory.md):

1. Each dynamic size ``x`` (a ``torch.export.Dim``) is sampled at ``p, p + 1, p + 2``
   (``p = max(Dim.min, 2)``: at 1 a dim is where torch and transformers take other paths, a
   view where a copy was, as ``torch.export`` specializes 0 and 1), every combination of
   sizes a step on fake tensors.
2. Every sample must run the same step: the same ops (op, module, phase) and the same storages
   (kind, module, the op that makes each and the one it dies at); otherwise an `InputError`
   names the first difference.
3. The live bytes of each op and kind are then a sum of storage sizes, each a product of
   sizes; the sample values' forward differences give the one polynomial of degree <= 2 in
   each size through them, in the basis ``C(x - p, j)`` (binomials, j = 0, 1, 2).
4. One more step, at the example's sizes (or ``p + 3`` where the example is a sample), must
   equal the polynomials at every op and kind; otherwise an `InputError`.
5. The peak's candidates are the ops whose polynomial no other op's bounds everywhere: in
   that basis every term is >= 0 for sizes >= p, so a point whose coefficients are all at
   most another's is at most it at every size (and it is dropped only where the other is
   earlier, or larger by a constant, so the peak's op is the concrete report's).

Exact at the sizes it ran; elsewhere it assumes what it checked at one extra point: the step
is the same, its storages' sizes are products of sizes of degree <= 2 each (a storage padded to
a multiple is not; the verification refuses it where it shows).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sympy
import torch

from .liveness import KINDS, live_by_kind
from .step import StepRun
from ..capture.held import copied
from ..errors import InputError
from ..records.symbolic import size_symbol
from ..records.symbolic_memory import KindExpressions, MemorySize, SymbolicMemoryReport
from ..records.symbolic_memory import SymbolicPoint

if TYPE_CHECKING:  # numpy is imported where a symbolic step runs: `import exportflops` needs none
    import numpy
from ..torch_internals import pytree

#: The degree in each size the samples determine (attention's scores: seq**2).
DEGREE = 2

Step = Callable[[tuple, dict], StepRun]


def symbolic_memory(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any,
                    step: Step, **record: Any) -> SymbolicMemoryReport:
    """The step's memory as polynomials in the sizes ``dynamic_shapes`` names; ``step(args,
    kwargs)`` runs one fake step; ``record``: the report's mode, optimizer and allocator."""
    import numpy
    name = type(model).__name__
    marks, sizes = marked_sizes(model, args, kwargs, dynamic_shapes)
    samples = [dict(zip(sizes, offsets))
               for offsets in itertools.product(range(DEGREE + 1), repeat=len(sizes))]
    runs = [step(*resized_inputs(args, kwargs, marks, _at(sizes, offsets))) for offsets in samples]
    for offsets, run in zip(samples[1:], runs[1:]):
        _same_step(name, runs[0], run, _at(sizes, samples[0]), _at(sizes, offsets))
    grid = numpy.stack([numpy.array([[live[k] for k in KINDS] for live in live_by_kind(run)],
                                    dtype=numpy.int64) for run in runs])
    coefficients = _differences(grid.reshape((DEGREE + 1,) * len(sizes) + grid.shape[1:]))
    verify = {size.name: size.example if size.example > size.min + DEGREE else size.min + 3
              for size in sizes.values()}
    _verified(name, model_step=lambda: step(*resized_inputs(args, kwargs, marks, verify)),
              first=runs[0], coefficients=coefficients, sizes=sizes, at=verify)
    flat = coefficients.reshape(-1, *coefficients.shape[-2:])  # (term, op, kind)
    kept = _undominated(flat.sum(axis=2).T)
    for kind in range(len(KINDS)):
        kept |= _undominated(flat[:, :, kind].T)
    basis = _basis(sizes)
    points = [_point(runs[0], index, flat[:, index, :], basis) for index in sorted(kept)]
    return SymbolicMemoryReport(
        model=name, sizes=list(sizes.values()), sampled=[_at(sizes, s) for s in samples],
        verified_at=verify, candidates=points, steps=len(runs[0].ops), **record)


def _at(sizes: dict[str, MemorySize], offsets: dict[str, int]) -> dict[str, int]:
    return {name: size.min + offsets[name] for name, size in sizes.items()}


def marked_sizes(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any
            ) -> tuple[dict[int, dict[int, str]], dict[str, MemorySize]]:
    """(each marked input tensor's id -> its dynamic dims' names, each size's range), read as
    ``analyze`` reads ``dynamic_shapes``: by forward's argument names, or in their order."""
    name = type(model).__name__
    bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    specs = (dynamic_shapes if isinstance(dynamic_shapes, dict)
             else dict(zip(bound, dynamic_shapes)))
    if set(specs) - set(bound):
        raise InputError(f"dynamic_shapes names {sorted(set(specs) - set(bound))}, which "
                         f"{name}.forward was not given: name its arguments {sorted(bound)}.")
    marks: dict[int, dict[int, str]] = {}
    sizes: dict[str, MemorySize] = {}
    for argument, value in bound.items():
        leaves = dict(pytree.tree_leaves_with_path(specs.get(argument), is_leaf=_is_spec))
        for path, tensor in pytree.tree_leaves_with_path(value):
            spec = leaves.get(path)
            if not isinstance(tensor, torch.Tensor) or spec is None:
                continue
            for dim, size in (spec.items() if isinstance(spec, dict) else enumerate(spec)):
                if size is None:
                    continue
                _check_dim(name, argument, tensor, dim, size)
                marks.setdefault(id(tensor), {})[dim % tensor.dim()] = size.__name__
                sizes.setdefault(size.__name__, _range(name, size, tensor.shape[dim]))
    if not sizes:
        raise InputError(f"dynamic_shapes={dynamic_shapes!r} marks no dim of {name}'s tensor "
                         f"inputs: give {{dim: torch.export.Dim(name)}} per input to resize.")
    return marks, sizes


def _is_spec(value: Any) -> bool:
    """A leaf of ``dynamic_shapes``: one tensor's spec (None, {dim: Dim}, or a Dim per dim)."""
    if value is None or isinstance(value, dict) and all(isinstance(k, int) for k in value):
        return True
    return isinstance(value, (tuple, list)) and all(
        v is None or isinstance(v, torch.export.Dim) for v in value)


def _check_dim(name: str, argument: str, tensor: torch.Tensor, dim: Any, size: Any) -> None:
    if type(size) is not torch.export.Dim:  # a Dim.AUTO hint, a derived 2 * Dim, an int
        raise InputError(f"dynamic_shapes[{argument!r}][{dim!r}] of {name} is {size!r}: "
                         f"memory() resizes by a plain torch.export.Dim(name) per dim.")
    if not isinstance(dim, int) or not -tensor.dim() <= dim < tensor.dim():
        raise InputError(f"dynamic_shapes[{argument!r}] names dim {dim!r}, but {argument} of "
                         f"{name} has shape {list(tensor.shape)}.")


def _range(name: str, size: torch.export.Dim, example: int) -> MemorySize:
    low = max(int(size.min), 2)  # step 1 of the module's docstring
    high = int(size.max) if isinstance(size.max, int) and size.max < 2**62 else None
    if high is not None and high < low + DEGREE + 1:
        raise InputError(f"Dim {size.__name__!r} of {name} allows [{size.min}, {size.max}]: "
                         f"memory() runs the step at {DEGREE + 2} sizes from {low}; widen it.")
    return MemorySize(name=size.__name__, example=example, min=low, max=high)


def resized_inputs(args: tuple, kwargs: dict, marks: dict[int, dict[int, str]],
             sizes: dict[str, int]) -> tuple[tuple, dict]:
    """The inputs with each marked dim at its size: the example's entries repeated in turn
    (entry ``i`` is entry ``i % n``: token ids stay token ids; a fake step reads no value).
    A tensor given twice (``input_ids`` as ``labels``) is one resized tensor twice, one
    storage as in the step at the example's size."""
    def resized(tensor: torch.Tensor) -> torch.Tensor:
        for dim, size_name in marks.get(id(tensor), {}).items():
            index = torch.arange(sizes[size_name], device=tensor.device) % tensor.shape[dim]
            tensor = tensor.index_select(dim, index)
        return tensor
    return copied((args, kwargs), resized)


def _same_step(name: str, first: StepRun, other: StepRun, at: dict, other_at: dict) -> None:
    """`InputError` unless ``other`` ran ``first``'s ops and storages (step 2 of the module's
    docstring)."""
    for index, (a, b) in enumerate(itertools.zip_longest(first.ops, other.ops)):
        if _which(a) != _which(b):  # the ops' arguments differ in size, by design
            raise InputError(
                f"The step of {name} changes with its sizes: at {at} op #{index} is "
                f"{_op(a)}, at {other_at} {_op(b)}. Its bytes are no polynomial across these "
                f"sizes; raise the Dim's min past the sizes that take another path, or call "
                f"memory() at each size.")
    lifetimes = [[(s.kind, s.module, s.start, s.end) for s in run.storages]
                 for run in (first, other)]
    if lifetimes[0] != lifetimes[1]:
        raise InputError(
            f"The step of {name} holds its tensors differently at {at} and {other_at} (the "
            f"same ops, other lifetimes): its bytes are no polynomial across these sizes; call "
            f"memory() at each size.")


def _which(op: Any) -> tuple | None:
    """What an op is, apart from its arguments' sizes."""
    return None if op is None else (op.name, op.module, op.phase)


def _op(op: Any) -> str:
    return "nothing (the step ended)" if op is None else f"{op.name} in {op.module!r} ({op.phase})"


def _differences(grid: numpy.ndarray) -> numpy.ndarray:
    """Forward differences of ``grid`` (sample offsets 0..DEGREE per size, then op and kind)
    along each size's axis: the coefficients of ``C(x - p, j)`` (Newton's forward formula)."""
    import numpy
    sizes = grid.ndim - 2
    for axis in range(sizes):
        rows = [grid.take(j, axis=axis) for j in range(DEGREE + 1)]
        grid = numpy.stack([sum((-1) ** (j - i) * math.comb(j, i) * rows[i]
                                for i in range(j + 1)) for j in range(DEGREE + 1)], axis=axis)
    return grid


def _weights(sizes: dict[str, MemorySize], at: dict[str, int]) -> numpy.ndarray:
    """``C(x - p, j)`` multiplied over the sizes, for each term j, in the grid's order."""
    import numpy
    return numpy.array([math.prod(math.comb(at[name] - size.min, j)
                                  for (name, size), j in zip(sizes.items(), term))
                        for term in itertools.product(range(DEGREE + 1), repeat=len(sizes))],
                       dtype=object)


def _verified(name: str, *, model_step: Callable[[], StepRun], first: StepRun,
              coefficients: numpy.ndarray, sizes: dict[str, MemorySize], at: dict) -> None:
    """Step 4 of the module's docstring."""
    import numpy
    run = model_step()
    _same_step(name, first, run, _at(sizes, dict.fromkeys(sizes, 0)), at)
    measured = numpy.array([[live[k] for k in KINDS] for live in live_by_kind(run)], dtype=object)
    flat = coefficients.reshape(-1, *coefficients.shape[-2:]).astype(object)
    predicted = numpy.tensordot(_weights(sizes, at), flat, axes=1)
    wrong = numpy.argwhere(predicted != measured)
    if len(wrong):
        index, kind = wrong[0]
        raise InputError(
            f"The {KINDS[kind]} of {name}'s step at {at} are {measured[index, kind]} bytes at "
            f"op #{index} ({_op(run.ops[index])}), not the {predicted[index, kind]} that the "
            f"samples from {_at(sizes, dict.fromkeys(sizes, 0))} give: some storage is no "
            f"product of sizes of degree <= {DEGREE} each (padded to a multiple, or cubic); "
            f"call memory() at each size.")


def _undominated(rows: numpy.ndarray) -> set[int]:
    """The rows (one op each, in step order: its coefficients) that no other row bounds
    everywhere while being earlier or larger by a constant (step 5 of the module's
    docstring)."""
    import numpy
    unique, first = numpy.unique(rows, axis=0, return_index=True)
    kept = set()
    for row, index in zip(unique, first):
        bounds = numpy.all(unique >= row, axis=1) & ((first < index) | (unique[:, 0] > row[0]))
        if not bounds.any():
            kept.add(int(index))
    return kept


def _basis(sizes: dict[str, MemorySize]) -> list[sympy.Expr]:
    """Each term's ``prod C(x - p, j)`` as a polynomial in the sizes' symbols."""
    def binomial(symbol: sympy.Symbol, low: int, j: int) -> sympy.Expr:
        return sympy.Mul(*(symbol - low - t for t in range(j))) / math.factorial(j)

    symbols = [(size_symbol(name), size.min) for name, size in sizes.items()]
    return [sympy.expand(sympy.Mul(*(binomial(s, low, j) for (s, low), j in zip(symbols, term))))
            for term in itertools.product(range(DEGREE + 1), repeat=len(sizes))]


def _point(run: StepRun, index: int, terms: numpy.ndarray,
           basis: list[sympy.Expr]) -> SymbolicPoint:
    """Op ``index``'s live bytes by kind, from its terms' coefficients (term, kind)."""
    def polynomial(column: numpy.ndarray) -> str:
        value = sympy.expand(sum(int(c) * b for c, b in zip(column, basis)))
        return str(value)

    op = run.ops[index]
    return SymbolicPoint(index=index, op=op.name, module=op.module, phase=op.phase,
                         live=KindExpressions(**{kind: polynomial(terms[:, k])
                                                 for k, kind in enumerate(KINDS)}))
