"""The formula registry validates what it is given: keys, formulas and the
counts formulas return, each refused with a typed error naming the op and, at a node, the node."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch import nn

from exportflops import Cost, InvalidFormulaError, analyze
from exportflops.errors import DuplicateFormulaError
from exportflops.formulas import FORMULAS, FormulaTable

aten = torch.ops.aten


def linear_model():
    return nn.Linear(4, 3, bias=False), (torch.randn(2, 4),)


def analyze_with_linear(formula):
    model, args = linear_model()
    return analyze(model, args, formulas={aten.linear: formula})


@pytest.mark.parametrize("formula, words", [
    (lambda call: 24, "returned int"),
    (lambda call: {"flops": 24}, "returned dict"),
    (lambda call: Cost(flops=-1), "flops=-1, a negative count"),
    (lambda call: Cost(macs=sympy.Rational(3, 2)), "macs=3/2, not an integer"),
    (lambda call: Cost(flops="abc"), "depends on abc, not a size of the node"),
    (lambda call: Cost(flops=1.5), "got float"),
    (lambda call: Cost(flops=True), "not a bool"),
])
def test_a_formula_result_that_is_not_a_cost_of_natural_counts_is_refused(formula, words):
    with pytest.raises(InvalidFormulaError) as caught:
        analyze_with_linear(formula)
    message = str(caught.value)
    assert words in message
    assert "aten.linear.default" in message and "at node 'linear'" in message


def test_a_count_in_the_node_s_own_dynamic_size_is_accepted():
    # Linear(4, 3) without bias on (b, 4): b*4*3 MACs; the formula below says exactly that
    # in the node's own symbol, so it must pass the check.
    model, args = linear_model()
    batch = torch.export.Dim("batch", min=2, max=64)

    def macs_of_linear(call):
        rows, inner = call["input"].shape
        return Cost(macs=rows * inner * call["weight"].shape[0])

    report = analyze(model, args, dynamic_shapes=({0: batch},),
                     formulas={aten.linear: macs_of_linear})
    assert report.evaluate(batch=5).total.macs == 5 * 4 * 3


@pytest.mark.parametrize("flops, refused", [
    (lambda rows: -2 * rows, True),  # negative for every size
    (lambda rows: -(rows ** 2) - rows, True),
    (lambda rows: rows - 2, False),  # zero at the smallest size, never negative
    (lambda rows: rows * (rows - 1), False),
    (lambda rows: -((rows - 1) ** 2) - 1, True),  # negative at 1: sympy's assumptions decide
    (lambda rows: rows ** 2 - 3 * rows + 3, False),  # 1 at 1, positive for every size
    (lambda rows: 3 * rows ** 2 - 2 * rows * (rows + 1), False),  # causal attention's shape
])
def test_a_symbolic_count_is_refused_exactly_when_it_is_negative(flops, refused):
    model, args = linear_model()
    batch = torch.export.Dim("batch", min=2, max=64)

    def formula(call):
        return Cost(flops=flops(call["input"].shape[0]))

    def run():
        return analyze(model, args, dynamic_shapes=({0: batch},), formulas={aten.linear: formula})

    if refused:
        with pytest.raises(InvalidFormulaError, match="a negative count"):
            run()
    else:
        assert run().evaluate(batch=5).total.flops == flops(5)


@pytest.mark.parametrize("key, words", [
    ("mm", "not a qualified op name"),
    (3, "(int) is not an op"),
    (nn.Linear, "(type) is not an op"),
])
def test_a_key_that_is_not_an_op_is_refused(key, words):
    with pytest.raises(InvalidFormulaError, match=words.replace("(", r"\(").replace(")", r"\)")):
        FormulaTable().register(key)(lambda call: Cost())
    with pytest.raises(InvalidFormulaError, match="not"):
        analyze_with_key(key)


def analyze_with_key(key):
    model, args = linear_model()
    return analyze(model, args, formulas={key: lambda call: Cost()})


def test_a_formula_that_is_not_callable_is_refused():
    with pytest.raises(InvalidFormulaError, match="must be a callable"):
        analyze_with_linear(Cost(flops=1))
    with pytest.raises(InvalidFormulaError, match="must be a callable"):
        FormulaTable().register(aten.mm)(5)


def test_an_overload_over_a_packet_with_a_formula_needs_replace():
    # Before: registering aten.mm.default silently replaced the built-in aten.mm formula for
    # every later call of that overload.
    with pytest.raises(DuplicateFormulaError, match="overload of aten.mm"):
        FORMULAS.register(aten.mm.default)(lambda call: Cost())
    assert aten.mm.default not in FORMULAS.entries


def test_replace_true_lets_an_overload_shadow_its_packet_on_purpose():
    table = FormulaTable()
    table.register(aten.mm)(lambda call: Cost(flops=1))
    table.register(aten.mm.default, replace=True)(lambda call: Cost(flops=2))
    assert table.lookup(aten.mm.default).formula(None).flops == 2
