"""Apply the formula table to walked nodes: one `NodeRecord` per node, never a silent zero."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from fractions import Fraction

import sympy
import torch

from .decompose import Decomposer
from ..errors import CountError, InvalidFormulaError, UncountedOpError
from ..formulas.registry import FormulaTable, built_in
from ..graph.eager_heads import NOTE as EAGER_NOTE
from ..graph.opcall import OpCall, TensorMeta
from ..records import Cost, NodeRecord, TensorSpec
from ..records.symbolic import factor_bases
from ..graph.walk import NodeCall


def count_node(node: NodeCall, table: FormulaTable, *, strict: bool, phase: str = "forward",
               differentiates: str = "", decomposer: Decomposer | None = None,
               sizes: Mapping | None = None) -> NodeRecord:
    """Count one node; ``strict`` turns an uncounted node into `UncountedOpError`. A node with
    no formula is counted through its decomposition when ``decomposer`` finds one; so is a
    composite with a built-in formula whose decomposition runs an op the user gave a formula
    for (`Decomposer.through_given`). ``sizes``: each data-dependent size's value on the
    example, where the capture measured them (the report is then counted at those values)."""
    entry = table.lookup(node.op)
    status, cost, note = "counted", Cost(), ""
    decomposed = None
    if decomposer is not None and entry is None:
        decomposed = decomposer.count(node, table)
    elif decomposer is not None and built_in(entry.formula):
        decomposed = decomposer.through_given(node, table)
    if decomposed is not None:
        status, cost, note = decomposed.status, decomposed.cost, decomposed.note
    elif entry is None:
        status, note = "uncounted", table.no_formula(node.op)
    else:
        try:
            cost = _applied(entry.formula, node.call, sizes)
        except CountError as error:
            raise InvalidFormulaError(f"{_where(entry.formula, node)} built a Cost with {error}: "
                                      f"counts are integers or expressions in sizes.") from error
        except Exception as error:  # a user's formula may raise anything; the node says which
            status, note = "error", f"{type(error).__name__}: {error}"
        else:
            cost = _checked(cost, entry.formula, node)
            if entry.zero_reason is not None:
                status, note = "zero", entry.zero_reason
    # A user's formula may read `TensorMeta.layout` and count a sparse tensor's nonzeros its
    # own way; the built-in ones count dense tensors.
    if (status == "counted" and (decomposed is not None or built_in(entry.formula))
            and (sparse := sparse_operand(node.call, cost))):
        status, cost, note = "uncounted", Cost(), sparse
    if node.region:
        cost, status, note = _in_region(node, cost, status, note)
    if strict and status in ("uncounted", "error"):
        raise UncountedOpError(node.name, node.op_name, node.module, reason=note)
    if node.eager_inputs:
        note = "; ".join(filter(None, (note, EAGER_NOTE)))
    # Every field is built here (the cost is a validated Cost): no validation needed.
    return NodeRecord.model_construct(
        name=node.name,
        op=node.op_name,
        module=node.module,
        status=status,
        inputs=[_spec(t) for t in node.call.tensor_inputs()],
        outputs=[_spec(t) for t in node.call.outputs],
        cost=cost,
        note=note,
        phase=phase,
        differentiates=differentiates,
        eager_inputs=[_spec(t) for t in node.eager_inputs],
    )


def _applied(formula, call: OpCall, sizes: Mapping | None) -> Cost:
    """``formula`` on ``call``; where it needs concrete sizes (an antialiased resize's windows,
    an adaptive pool's) and the call's symbols all have values in ``sizes``, at those."""
    try:
        return formula(call)
    except Exception:
        symbols = call.size_symbols()
        if not (sizes and symbols and symbols <= sizes.keys()):
            raise
    return formula(call.at_sizes(sizes))


def sparse_operand(call: OpCall, cost: Cost) -> str:
    """Why ``cost`` is no count of ``call``: a tensor of it is sparse, and a sparse kernel's
    arithmetic follows the nonzeros it stores, a value no shape holds (a matmul of a 1000 x
    1000 COO matrix holding 10 nonzeros does 10 multiply-adds per column, not 1000). The
    formulas count dense tensors; an op with no arithmetic (a view, ``to_dense``) stays
    counted. Empty where every tensor is strided."""
    layouts = {t.layout for t in (*call.tensor_inputs(), *call.outputs)
               if isinstance(t, TensorMeta)} - {torch.strided}
    if not layouts or (cost.flops == 0 and cost.macs == 0):
        return ""
    names = ", ".join(sorted(str(layout).removeprefix("torch.") for layout in layouts))
    return (f"a sparse tensor ({names}): its cost follows the nonzeros it stores, which the "
            f"graph does not hold; counted dense it would be {cost.flops} FLOPs. Count it with "
            f"your own formula (formulas=), or pass it dense (.to_dense()) to count it so")


def _checked(cost: object, formula, node: NodeCall) -> Cost:
    """A formula's result, refused unless it is a Cost of natural counts in the node's sizes:
    a wrong count would otherwise reach every total silently."""
    where = _where(formula, node)
    if not isinstance(cost, Cost):
        raise InvalidFormulaError(
            f"{where} returned {type(cost).__name__}: a formula returns "
            f"exportflops.Cost(flops=..., macs=...) or call.cost(...) (bytes from its tensors)."
        )
    for name in Cost.model_fields:
        value = getattr(cost, name)
        problem = _count_problem(value, node.call) if value != 0 else None
        if problem:
            raise InvalidFormulaError(
                f"{where} returned {name}={value}, {problem}: counts are non-negative integers, "
                f"or expressions in the dynamic sizes the node sees."
            )
    return cost


def _where(formula, node: NodeCall) -> str:
    return (f"the formula {getattr(formula, '__qualname__', formula)} for {node.op_name} at node "
            f"{node.name!r} (module {node.module or '<root>'!r})")


def _count_problem(value, call) -> str | None:
    if isinstance(value, int):
        return "a negative count" if value < 0 else None
    if value.is_number:
        return "not an integer"
    stray = value.free_symbols - call.size_symbols()
    if stray:
        return f"which depends on {', '.join(sorted(map(str, stray)))}, not a size of the node"
    if _plainly_positive(value) or _not_negative_at_ones(value):
        return None
    return "a negative count" if value.is_negative else None


def _plainly_positive(value) -> bool:
    """Whether ``value`` is a sum of products of positive integers and positive symbols (and
    their integer powers), so positive: what nearly every count is, read off its terms without
    sympy's assumption system (which a new expression pays for once, a third of the count of a
    symbolic GPT-2)."""
    return all((base.is_Integer and base > 0) or (base.is_Symbol and base.is_positive)
               for base in factor_bases(value))


def _not_negative_at_ones(value) -> bool:
    """Whether ``value`` is at least 0 with every symbol 1, a value each of them may take: then
    no assumption makes it negative for every size, and sympy, asked, could not say it is (it
    took 2-4 ms for each new causal attention count, ``3156*s**2 - 1578*s*(s + 1)``). False
    where that is not read off plainly: sympy is asked."""
    if not all(_one_allowed(symbol) for symbol in value.free_symbols):
        return False
    at_ones = _at_ones(value)
    return at_ones is not None and at_ones >= 0


@functools.lru_cache(maxsize=256)
def _one_allowed(symbol) -> bool:
    """Whether 1 has every property assumed of ``symbol`` (a size's: a positive integer)."""
    return all(getattr(sympy.S.One, f"is_{fact}") == holds
               for fact, holds in symbol.assumptions0.items())


def _at_ones(value) -> Fraction | None:
    """``value`` with every symbol 1, exactly; None where it is more than sums, products and
    integer powers of rationals and symbols (or divides by zero there)."""
    if value.is_Symbol:
        return Fraction(1)
    if value.is_Rational:
        return Fraction(int(value.p), int(value.q))
    if value.is_Pow and value.exp.is_Integer:
        base = _at_ones(value.base)
        return None if base is None or (base == 0 and value.exp < 0) else base ** int(value.exp)
    if value.is_Add or value.is_Mul:
        parts = [_at_ones(arg) for arg in value.args]
        if any(part is None for part in parts):
            return None
        return sum(parts) if value.is_Add else math.prod(parts)
    return None


def _in_region(node: NodeCall, cost: Cost, status: str, note: str) -> tuple[Cost, str, str]:
    """An op inside a control-flow subgraph: scaled by its runs, or uncounted when unknown."""
    if status not in ("counted", "zero"):
        return cost, status, f"{node.region}: {note}"
    if node.repeat is None:
        return Cost(), "uncounted", (f"{node.region}: runs an unknown number of times "
                                       f"(trip count not known at export); {cost.flops} FLOPs "
                                       f"per run")
    suffix = f", x{node.repeat}" if node.repeat != 1 else ""
    where = f"{node.region}{suffix}" + (f"; {note}" if note else "")
    return cost.scaled(node.repeat), status, where


def untraced_backward(node: NodeCall, reason: str, *, strict: bool,
                      half: str = "") -> NodeRecord:
    """The record of a forward node whose backward (its ``half`` of it, when split) could not
    be traced: missing, not zero."""
    name = f"{node.name}.backward.{half}" if half else f"{node.name}.backward"
    return _missing(node, f"backward not traced: {reason}", strict=strict, name=name,
                    status="error", outputs=[], phase="backward", differentiates=node.name,
                    formula=True)


def outside_torch(node: NodeCall, reason: str, *, strict: bool, phase: str = "forward",
                  differentiates: str = "") -> NodeRecord:
    """The record of a call of an eager run whose work torch does not see (values handed to
    numpy, `capture.outside`): uncounted, not zero, so that coverage says so."""
    return _missing(node, reason, strict=strict, name=node.name, status="uncounted",
                    outputs=[_spec(t) for t in node.call.outputs], phase=phase,
                    differentiates=differentiates, formula=False)


def _missing(node: NodeCall, note: str, *, strict: bool, name: str, status: str,
             outputs: list[TensorSpec], phase: str, differentiates: str,
             formula: bool) -> NodeRecord:
    """A record of ``node`` whose cost is missing from every total (``strict`` raises; a
    formula for its op fixes it where ``formula``)."""
    if strict:
        raise UncountedOpError(node.name, node.op_name, node.module, reason=note,
                               formula=formula)
    return NodeRecord(name=name, op=node.op_name, module=node.module, status=status,
                      inputs=[_spec(t) for t in node.call.tensor_inputs()], outputs=outputs,
                      cost=Cost(), note=note, phase=phase, differentiates=differentiates)


@functools.lru_cache(maxsize=4096)
def _spec(tensor: TensorMeta) -> TensorSpec:
    # A transformer repeats the same few shapes in every layer; records are frozen, so shared.
    return TensorSpec.of(tensor.shape, tensor.dtype)
