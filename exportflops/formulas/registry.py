"""The op -> formula registry. A formula sees an `OpCall` and returns a `Cost`, the record
type the report itself holds.

A formula is a small pure function ``(call: OpCall) -> Cost``. It reads shapes, dtypes and scalar
arguments, never calls torch, and never turns a size into ``int``: sizes may be symbolic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from ..errors import DuplicateFormulaError, InvalidFormulaError
from ..graph.opcall import OpCall, Size, TensorMeta  # noqa: F401  (formula files import them here)
from ..records import FLOPS_PER_MAC, Cost  # noqa: F401
from ..records.base import READ_FIELDS
from ..torch_internals import OpOverload, OpOverloadPacket

#: The note of an op counted neither by a formula nor through a decomposition.
NO_FORMULA = "no formula"


class AbsentOp:
    """An op the formula files name that the running torch does not define (a release removed
    it, or added it later). Registering it does nothing but record its name, so the table
    loads on every release; `FormulaTable.absent` lists the names."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, overload: str) -> AbsentOp:
        if overload.startswith("__"):
            raise AttributeError(overload)
        return AbsentOp(f"{self.name}.{overload}")

    def __repr__(self) -> str:
        return f"AbsentOp({self.name})"


class OpNames:
    """``torch.ops.<namespace>`` for formula files: ``aten.cholesky`` is the op where this torch
    defines it, else an `AbsentOp` (``torch.ops.aten.cholesky`` itself raises on torch 2.14)."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(getattr(torch.ops, self._namespace), name)
        except (AttributeError, RuntimeError):
            return AbsentOp(f"{self._namespace}.{name}")


#: The aten namespace as formula files name it: an op this torch lacks is an `AbsentOp`.
aten = OpNames("aten")

Formula = Callable[[OpCall], Cost]
#: An overload, a packet, or a qualified op name string such as ``"transformers::grouped_mm"``.
OpKey = Union[OpOverload, OpOverloadPacket, str, Any]


@dataclass(frozen=True)
class Entry:
    """A registered formula; ``zero_reason`` is set for ops declared free of arithmetic."""

    formula: Formula
    zero_reason: str | None = None


@dataclass
class FormulaTable:
    """Formulas keyed by op overload or packet; an overload's own entry wins over its packet's."""

    entries: dict[OpKey, Entry] = field(default_factory=dict)
    value_dependent: dict[OpKey, str] = field(default_factory=dict)
    """Ops no formula of shapes can count, each with the reason reports show."""
    absent: set[str] = field(default_factory=set)
    """Ops the formula files name that this torch does not define, skipped when registered."""

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
        outputs), ``"view-or-copy"`` (nothing when the call returned a view of its input, else
        a copy: `OpCall.aliased`) or ``"write"`` (fills new outputs, reading no tensor data).
        """
        if moves not in ("nothing", "copy", "view-or-copy", "write"):
            raise ValueError(f"moves must be 'nothing', 'copy', 'view-or-copy' or 'write', "
                             f"got {moves!r}")

        def zero(call: OpCall) -> Cost:
            if moves == "nothing" or (moves == "view-or-copy" and call.aliased):
                return Cost()
            full = call.cost()  # a copy, or a view-or-copy that copied
            if moves == "write":
                return full.model_copy(update=dict.fromkeys(READ_FIELDS, 0))
            return full

        zero.__qualname__ = f"zero[{moves}]"
        for op in ops:
            self._add(op, Entry(zero, zero_reason=reason), replace=False)

    def register_value_dependent(self, ops: list[OpKey], reason: str) -> None:
        """Declare ops whose work depends on the tensors' values (an iterative solver's sweeps):
        they stay uncounted unless a formula is given, and reports say ``reason``."""
        for op in ops:
            if not self._skipped(op):
                self.value_dependent[op] = reason

    def value_dependence(self, op: OpKey) -> str | None:
        """Why ``op``'s work depends on values, where it is declared so; else None."""
        reason = self.value_dependent.get(op)
        if reason is None and isinstance(op, OpOverload):
            reason = self.value_dependent.get(op.overloadpacket)
        return None if reason is None else (f"{op} {reason}; pass formulas={{{op}: ...}} with "
                                            f"an estimate of your own to count it")

    def no_formula(self, op: OpKey) -> str:
        """The note of ``op`` uncounted for want of a formula, with why where declared."""
        reason = self.value_dependence(op)
        return NO_FORMULA if reason is None else f"{NO_FORMULA}: {reason}"

    def given(self, op: OpKey) -> bool:
        """Whether ``op``'s formula here is one a user gave (``formulas=``, `register_formula`
        outside exportflops), not the built-in one."""
        entry = self.lookup(op)
        return entry is not None and not built_in(entry.formula)

    def any_given(self) -> bool:
        """Whether some formula of this table is a user's."""
        return any(not built_in(entry.formula) for entry in self.entries.values())

    def remove(self, op: OpKey) -> None:
        """Forget the formula registered for exactly ``op``."""
        if self.entries.pop(op, None) is None:
            raise KeyError(f"{op} has no formula of its own in this table")

    def lookup(self, op: OpKey) -> Entry | None:
        """The entry of the overload, else of its packet, else of its qualified name
        (``"mylib::fused_rope"``: a formula for a library's op that needs no import of it)."""
        entry = self.entries.get(op)
        if entry is None and isinstance(op, OpOverload):
            entry = (self.entries.get(op.overloadpacket)
                     or self.entries.get(op.overloadpacket._qualified_op_name))
        return entry

    def with_overrides(self, formulas: Mapping[OpKey, Formula] | None) -> FormulaTable:
        """A copy of this table where ``formulas`` replace or extend the entries."""
        merged = FormulaTable(dict(self.entries), dict(self.value_dependent), set(self.absent))
        for op, formula in (formulas or {}).items():
            _check(op, formula, where=f"formulas[{op}]")
            merged.entries[op] = Entry(formula)
        return merged

    def _skipped(self, op: OpKey) -> bool:
        """Whether ``op`` is absent from this torch: then its name is recorded, nothing else."""
        if isinstance(op, AbsentOp):
            self.absent.add(op.name)
            return True
        return False

    def _add(self, op: OpKey, entry: Entry, replace: bool) -> None:
        if self._skipped(op):
            return
        _check(op, entry.formula, where=f"the formula registered for {op}")
        if op in self.entries and not replace:
            raise DuplicateFormulaError(
                f"{op} already has a formula ({self.entries[op].formula.__qualname__}); "
                f"pass replace=True to override it."
            )
        packet = getattr(op, "overloadpacket", None)
        if packet in self.entries and not replace:
            # The overload's entry wins at lookup: it would replace the packet's formula for
            # every later call of that overload, which must be asked for.
            raise DuplicateFormulaError(
                f"{op} is an overload of {packet}, which already has a formula "
                f"({self.entries[packet].formula.__qualname__}); registering it would replace "
                f"that formula for every call of {op}: pass replace=True if that is meant."
            )
        self.entries[op] = entry


def built_in(formula: Formula) -> bool:
    """A formula of exportflops' own table (its formula files, a zero declared with a reason),
    not one a user gave."""
    return getattr(formula, "__module__", "").startswith("exportflops.")


def _check(op: OpKey, formula: Any, *, where: str) -> None:
    """Refuse keys no graph node can have and formulas that cannot be called."""
    if isinstance(op, str):
        if "::" not in op:
            raise InvalidFormulaError(
                f"{where}: the key {op!r} is not a qualified op name; write it as "
                f"'namespace::name' (e.g. 'mylib::fused_rope') or pass the op itself "
                f"(torch.ops.aten.mm)."
            )
    elif not callable(op) or isinstance(op, type):
        raise InvalidFormulaError(
            f"{where}: the key {op!r} ({type(op).__name__}) is not an op; pass an op such as "
            f"torch.ops.aten.mm or torch.ops.aten.mm.default, or 'namespace::name'."
        )
    if not callable(formula):
        raise InvalidFormulaError(
            f"{where} must be a callable (OpCall) -> Cost, got {type(formula).__name__}."
        )


#: The global table that `register_formula` fills and `analyze` uses by default.
FORMULAS = FormulaTable()


def register_formula(*ops: OpKey, replace: bool = False) -> Callable[[Formula], Formula]:
    """Register ``(OpCall) -> Cost`` for ops in the global table. See `FormulaTable.register`."""
    return FORMULAS.register(*ops, replace=replace)


def aten_ops(*names: str, in_place: bool = True) -> list:
    """The aten packets (``"mul"``) or overloads (``"scatter.src"``) named, each packet with its
    in-place variant (``mul_``) where torch has one. A name this torch does not define comes
    back as an `AbsentOp`, which the table records in ``absent``; a test checks each absent name
    against the ops torch releases are known to lack, so a typo still fails."""
    ops = []
    for name in names:
        packet_name, _, overload = name.partition(".")
        packet = getattr(aten, packet_name)
        ops.append(getattr(packet, overload, None) or AbsentOp(f"aten.{name}") if overload
                   else packet)
        in_place_op = getattr(aten, f"{packet_name}_")
        if in_place and not overload and not isinstance(in_place_op, AbsentOp):
            ops.append(in_place_op)
    return ops


def absent_ops(table: FormulaTable | None = None) -> list[str]:
    """The ops the built-in formula files name that this torch lacks, sorted: what a torch
    release removed (``aten.cholesky`` from 2.14) or has not added yet."""
    return sorted((table or FORMULAS).absent)
