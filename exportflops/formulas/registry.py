"""The op -> formula registry, and what a formula sees (`OpCall`) and returns (`Cost`).

A formula is a small pure function ``(call: OpCall) -> Cost``. It reads shapes, dtypes and scalar
arguments, never calls torch, and never turns a size into ``int``: sizes may be symbolic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Union

import torch

from ..errors import DuplicateFormulaError

#: One multiply-accumulate is one MAC and this many FLOPs (a multiply and an add).
FLOPS_PER_MAC = 2

Size = Any  # an int, or a sympy expression when the dimension is dynamic


@dataclass(frozen=True)
class Cost:
    """The work of one op call. Values are ints, or sympy expressions for symbolic sizes.

    ``macs`` are the multiply-accumulates of contractions (matmul, conv, attention); the
    "matmul family" FLOPs of a report are ``FLOPS_PER_MAC * macs``. ``masked_flops`` and
    ``masked_macs`` are the part of ``flops``/``macs`` spent on positions a causal mask discards.
    """

    flops: Size = 0
    macs: Size = 0
    bytes_read: Size = 0
    bytes_written: Size = 0
    masked_flops: Size = 0
    masked_macs: Size = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Cost)))

    def scaled(self, factor: Size) -> Cost:
        """This cost repeated ``factor`` times."""
        return Cost(*(getattr(self, f.name) * factor for f in fields(Cost)))


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor argument or output, as a formula sees it."""

    shape: tuple[Size, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> Size:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> Size:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class OpCall:
    """One call of an op: its arguments by schema name (tensors as `TensorMeta`) and its outputs."""

    op: Any
    args: Mapping[str, Any]
    outputs: tuple[TensorMeta, ...]

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

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

    def cost(self, flops: Size = 0, macs: Size = 0, *, masked_flops: Size = 0,
             masked_macs: Size = 0, moves_data: bool = True) -> Cost:
        """A `Cost` whose bytes are every tensor input read once and every output written once.

        ``moves_data=False`` is for views and metadata ops, which touch no tensor data.
        """
        if not moves_data:
            return Cost(flops=flops, macs=macs)
        return Cost(
            flops=flops,
            macs=macs,
            bytes_read=sum(t.nbytes for t in self.tensor_inputs()),
            bytes_written=sum(t.nbytes for t in self.outputs),
            masked_flops=masked_flops,
            masked_macs=masked_macs,
        )


Formula = Callable[[OpCall], Cost]
#: An overload, a packet, or a qualified op name string such as ``"transformers::grouped_mm"``.
OpKey = Union[torch._ops.OpOverload, torch._ops.OpOverloadPacket, str, Any]


@dataclass(frozen=True)
class Entry:
    """A registered formula; ``zero_reason`` is set for ops declared free of arithmetic."""

    formula: Formula
    zero_reason: str | None = None


@dataclass
class FormulaTable:
    """Formulas keyed by op overload or packet; an overload's own entry wins over its packet's."""

    entries: dict[OpKey, Entry] = field(default_factory=dict)

    def register(self, *ops: OpKey, replace: bool = False) -> Callable[[Formula], Formula]:
        """Decorator: ``@table.register(aten.mm, aten.mm.default)``. Duplicates need ``replace``."""

        def decorate(formula: Formula) -> Formula:
            for op in ops:
                self._add(op, Entry(formula), replace)
            return formula

        return decorate

    def register_zero(self, ops: list[OpKey], reason: str, *, moves: str) -> None:
        """Declare ops that do no arithmetic, with the ``reason`` reports show.

        ``moves``: ``"nothing"`` (views, metadata), ``"copy"`` (reads its inputs, writes its
        outputs) or ``"write"`` (fills new outputs, reading no tensor data).
        """
        if moves not in ("nothing", "copy", "write"):
            raise ValueError(f"moves must be 'nothing', 'copy' or 'write', got {moves!r}")

        def zero(call: OpCall) -> Cost:
            if moves == "nothing":
                return Cost()
            full = call.cost()
            return Cost(bytes_read=full.bytes_read if moves == "copy" else 0,
                        bytes_written=full.bytes_written)

        zero.__qualname__ = f"zero[{moves}]"
        for op in ops:
            self._add(op, Entry(zero, zero_reason=reason), replace=False)

    def remove(self, op: OpKey) -> None:
        """Forget the formula registered for exactly ``op``."""
        if self.entries.pop(op, None) is None:
            raise KeyError(f"{op} has no formula of its own in this table")

    def lookup(self, op: OpKey) -> Entry | None:
        """The entry of the overload, else of its packet, else of its qualified name
        (``"mylib::fused_rope"``: a formula for a library's op that needs no import of it)."""
        entry = self.entries.get(op)
        if entry is None and isinstance(op, torch._ops.OpOverload):
            entry = (self.entries.get(op.overloadpacket)
                     or self.entries.get(op.overloadpacket._qualified_op_name))
        return entry

    def with_overrides(self, formulas: Mapping[OpKey, Formula] | None) -> FormulaTable:
        """A copy of this table where ``formulas`` replace or extend the entries."""
        merged = FormulaTable(dict(self.entries))
        for op, formula in (formulas or {}).items():
            if not callable(formula):
                raise TypeError(
                    f"formulas[{op}] must be a callable (OpCall) -> Cost, got {type(formula).__name__}"
                )
            merged.entries[op] = Entry(formula)
        return merged

    def _add(self, op: OpKey, entry: Entry, replace: bool) -> None:
        if op in self.entries and not replace:
            raise DuplicateFormulaError(
                f"{op} already has a formula ({self.entries[op].formula.__qualname__}); "
                f"pass replace=True to override it."
            )
        self.entries[op] = entry


#: The global table that `register_formula` fills and `analyze` uses by default.
FORMULAS = FormulaTable()


def register_formula(*ops: OpKey, replace: bool = False) -> Callable[[Formula], Formula]:
    """Register ``(OpCall) -> Cost`` for ops in the global table. See `FormulaTable.register`."""
    return FORMULAS.register(*ops, replace=replace)
