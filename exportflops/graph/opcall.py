"""What a formula sees: one op call (`OpCall`) with its tensors as `TensorMeta`.

Built by `walk` from the graph and by `backward` from the ops autograd runs; read by the formulas.
Sizes are ints, or sympy expressions when the dimension is dynamic: nothing here turns a size
into ``int``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import sympy
import torch

from ..records import Cost
from ..records.symbolic import parse_count

Size = Any  # an int, or a sympy expression when the dimension is dynamic

#: What a tensor holds, for bytes by kind: a weight (a parameter, a buffer the model never
#: mutates, a lifted constant, or a view of one), mutated state (a KV cache: a buffer or input the
#: graph writes, or a view of it), or an activation (everything else: inputs, computed values).
WEIGHT, STATE, ACTIVATION = "weight", "state", "activation"


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor argument or output, as a formula sees it."""

    shape: tuple[Size, ...]
    dtype: torch.dtype
    kind: str = ACTIVATION
    """`WEIGHT`, `STATE` or `ACTIVATION`, from the graph signature (`kinds.tensor_kinds`); in a
    backward op, that of the forward argument the tensor is (a view of) (`replay.Recorder`)."""
    broadcast: tuple[int, ...] = ()
    """Dimensions of stride 0 (an ``expand``): their elements repeat one stored element."""
    layout: torch.layout = torch.strided
    """A sparse layout (``torch.sparse_coo``, ``sparse_csr``, ...) stores only its nonzeros, a
    number the graph does not hold (`count.sparse_operand`)."""

    @property
    def numel(self) -> Size:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> Size:
        """The bytes the tensor occupies in memory: an expanded view reads its stored elements
        once (GQA's keys expanded to the query heads read the key heads' bytes)."""
        stored = math.prod(d for i, d in enumerate(self.shape) if i not in self.broadcast)
        return stored * self.dtype.itemsize


@dataclass(frozen=True)
class OpCall:
    """One call of an op: its arguments by schema name (tensors as `TensorMeta`) and its outputs."""

    op: Any
    args: Mapping[str, Any]
    outputs: tuple[TensorMeta, ...]
    aliased: bool = False
    """The first output shares storage with a tensor argument: the call returned a view (a
    ``reshape`` whose strides allow it, a ``contiguous`` of a contiguous tensor), not a copy."""

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

    @property
    def packet(self) -> str:
        """The op's name without its overload: ``upsample_bilinear2d`` for ``.vec`` too."""
        return self.op.__name__.split(".")[0]

    def get(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, default)

    @property
    def out(self) -> TensorMeta:
        """The first tensor output."""
        return self.outputs[0]

    def tensor_inputs(self) -> Iterator[TensorMeta]:
        for value in self.args.values():
            if isinstance(value, TensorMeta):
                yield value
            elif isinstance(value, (list, tuple)):
                yield from (v for v in value if isinstance(v, TensorMeta))

    def size_symbols(self) -> set:
        """The dynamic sizes this call sees, in its tensors' shapes and its scalar arguments:
        the only names a count of it can depend on."""
        symbols: set = set()
        pending = [*self.args.values(), *self.outputs]
        while pending:
            value = pending.pop()
            if isinstance(value, TensorMeta):
                pending.extend(value.shape)
            elif isinstance(value, (list, tuple)):
                pending.extend(value)
            elif isinstance(value, sympy.Basic):
                symbols |= value.free_symbols
        return symbols

    def at_sizes(self, values: Mapping[sympy.Symbol, int]) -> OpCall:
        """This call with each size symbol of ``values`` replaced by its value: for a formula
        that needs concrete sizes, where the capture measured them on the example."""
        def fixed(value: Any) -> Any:
            if isinstance(value, TensorMeta):
                return replace(value, shape=tuple(fixed(d) for d in value.shape))
            if isinstance(value, (list, tuple)):
                return type(value)(fixed(v) for v in value)
            if isinstance(value, sympy.Basic):
                return parse_count(value.xreplace(values))
            return value

        return replace(self, args={name: fixed(v) for name, v in self.args.items()},
                       outputs=fixed(self.outputs))

    def cost(self, flops: Size = 0, macs: Size = 0, *, masked_flops: Size = 0,
             masked_macs: Size = 0, moves_data: bool = True) -> Cost:
        """The `Cost` of this call, whose bytes are every tensor input read once and every
        output written once.

        ``moves_data=False`` is for views and metadata ops, which touch no tensor data.
        """
        if not moves_data:
            return Cost(flops=flops, macs=macs)
        return Cost(flops=flops, macs=macs, masked_flops=masked_flops, masked_macs=masked_macs,
                      **bytes_by_kind(((t, t.nbytes) for t in self.tensor_inputs()),
                                      ((t, t.nbytes) for t in self.outputs)))


def bytes_by_kind(reads: Iterable[tuple[TensorMeta, Size]],
                  writes: Iterable[tuple[TensorMeta, Size]]) -> dict[str, Size]:
    """The byte fields of a `Cost` for ``(tensor, bytes)`` read and written, each charged to
    its tensor's kind: for a formula that reads part of a tensor (an embedding's gathered rows)."""
    read = {WEIGHT: 0, STATE: 0, ACTIVATION: 0}
    written = {STATE: 0, ACTIVATION: 0}
    for tensor, nbytes in reads:
        read[tensor.kind] += nbytes
    for tensor, nbytes in writes:
        # A weight an op writes into is state (the graph mutates it).
        written[STATE if tensor.kind == WEIGHT else tensor.kind] += nbytes
    return {"bytes_read": sum(read.values()), "bytes_written": sum(written.values()),
            "weight_bytes_read": read[WEIGHT], "state_bytes_read": read[STATE],
            "state_bytes_written": written[STATE]}


def bind_schema(schema: torch.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An op call's arguments by schema name; one not given takes its default (else None)."""
    named = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            named[argument.name] = args[i]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
        else:
            named[argument.name] = None
    return named
