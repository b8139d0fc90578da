"""Dynamic sizes as sympy symbols: one symbol per size name, counts parsed from JSON, and the
evaluation of expressions at given sizes. Torch-free, and below the records: they use it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import sympy
from sympy.core.add import _addsort

from ..errors import CountError


def size_symbol(name: str) -> sympy.Symbol:
    """The one symbol a dynamic size named ``name`` becomes: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


def factor_bases(value: sympy.Expr) -> Iterator[sympy.Expr]:
    """The base of each factor of each term of ``value`` read as a sum of products (a power's
    base where its exponent is an integer, any other factor itself): what tells, without
    sympy's assumption system, that a count is a plain polynomial (`aggregate`, expanded) or
    a positive one (`count.apply`)."""
    for term in value.args if value.is_Add else (value,):
        for factor in term.args if term.is_Mul else (term,):
            yield factor.base if factor.is_Pow and factor.exp.is_Integer else factor


def polynomial(constant: int | sympy.Rational, coefficients: dict) -> sympy.Expr:
    """``constant + sum(coefficient * monomial)`` for like terms collected already (monomial ->
    its int or rational coefficient, each monomial free of numbers), the same expression
    ``sympy.Add`` makes of them: each term a product with its coefficient first, the terms in
    sympy's order, a constant ahead of them. Made as ``Add.flatten`` makes its result, without
    the general product machinery it runs for each term of a symbol or a power (sympy's
    assumptions on each new coefficient: some 5 ms of a GPT-2's first symbolic analysis). A
    monomial of any other form is multiplied by sympy."""
    terms = []
    for monomial, coefficient in coefficients.items():
        if not coefficient:
            continue
        if monomial is sympy.S.One:
            constant += coefficient
        elif coefficient == 1:
            terms.append(monomial)
        elif not monomial.is_Add and all(base.is_Symbol for base in factor_bases(monomial)):
            factors = monomial.args if monomial.is_Mul else (monomial,)
            terms.append(sympy.Mul._from_args((sympy.Rational(coefficient), *factors), True))
        else:
            terms.append(coefficient * monomial)
    if not all(term.is_Mul or term.is_Symbol or term.is_Pow for term in terms):
        return sympy.Add(constant, *terms)
    _addsort(terms)
    if constant:
        terms.insert(0, sympy.Rational(constant))
    if len(terms) > 1:
        return sympy.Add._from_args(terms, True)
    return terms[0] if terms else sympy.Integer(0)


def parse_count(value: Any) -> int | sympy.Expr:
    """An int, or a sympy expression in the user's size names (from JSON: its string)."""
    if isinstance(value, bool):
        raise CountError("a count is an integer or an expression, not a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        value = sympy.sympify(value)
        value = value.xreplace({s: size_symbol(s.name) for s in value.free_symbols})
    if isinstance(value, sympy.Basic):
        return int(value) if value.is_Integer else value
    raise CountError(f"a count is an integer or an expression, got {type(value).__name__}")


class Evaluator:
    """Evaluates expressions at fixed sizes, each distinct expression once: a transformer
    repeats the same ones in every layer."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = {size_symbol(name): value for name, value in values.items()}
        self.cache: dict = {}

    def value(self, expr: int | sympy.Expr | str) -> int:
        """``expr`` at the sizes; a string is parsed first (a dynamic size in a shape)."""
        if isinstance(expr, int):
            return expr
        result = self.cache.get(expr)
        if result is None:
            parsed = parse_count(expr) if isinstance(expr, str) else expr
            result = self.cache[expr] = int(parsed.xreplace(self.values))
        return result


def largest_size(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest size (a batch, a length; from ``low`` to ``high``) ``fits`` accepts, assuming
    a step of a larger size never needs fewer bytes: doubling until one does not fit, then
    halving the gap; 0 when ``low`` does not fit."""
    if not fits(low):
        return 0
    while low < high and fits(min(2 * low, high)):
        low = min(2 * low, high)
    if low == high:
        return low
    high = min(2 * low, high)  # the first size known not to fit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
