"""Symbolic counts: one export with dynamic batch and seq, evaluated without re-exporting.

Two sources of truth: concrete analyses at the same sizes (the evaluated symbolic report must
equal them per module and per operator), and GPT-2's matmul polynomial derived by hand below.
"""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.export import Dim

from exportflops import Cost, analyze
from exportflops.examples.gpt2 import gpt2
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.records.symbolic import polynomial, size_symbol

SIZES = [(1, 8), (2, 64), (3, 100), (1, 512), (4, 1024)]  # (batch, seq)
SMALL_LLAMA = LlamaConfig(vocab_size=1000, dim=256, n_layers=2, n_heads=8, n_kv_heads=2,
                          head_dim=32, ffn_dim=688, max_seq_len=1024)
MODELS = {
    "gpt2": lambda batch, seq: gpt2("meta", seq_len=seq, batch=batch),
    "llama": lambda batch, seq: llama("meta", SMALL_LLAMA, seq_len=seq, batch=batch),
}


# Export specializes sizes 0 and 1; evaluating at batch 1 is still exact (see symbolic.py).
DYNAMIC = ({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=1024)},)


@pytest.fixture(scope="module", params=list(MODELS))
def symbolic(request):
    make = MODELS[request.param]
    model, args = make(2, 16)
    return make, analyze(model, args, dynamic_shapes=DYNAMIC)


def test_counts_are_polynomials_in_the_users_dim_names(symbolic):
    _, report = symbolic
    names = {s.name for s in report.total.flops.free_symbols}
    assert names == {"batch", "seq"}
    assert {s.name for s in report.symbols} == {"batch", "seq"}


def test_gpt2_matmul_flops_equal_the_hand_derived_polynomial():
    """Per sequence of T tokens, GPT-2 124M (L=12, C=768, vocab 50304, head on the last token):
    attention core, scores + reduce: L * 2 * T^2 * C MACs = 18,432 T^2;
    linears: L * T * (C*3C + C*C + 2*C*4C) MACs = 12 * 7,077,888 T = 84,934,656 T;
    lm_head on one position: C * 50304 = 38,633,472 MACs. FLOPs = 2 x MACs, times batch."""
    model, args = gpt2("meta", seq_len=16, batch=2)
    report = analyze(model, args, dynamic_shapes=DYNAMIC)
    batch, seq = sorted(report.total.flops.free_symbols, key=lambda s: s.name)
    expected = 2 * batch * (18_432 * seq**2 + 84_934_656 * seq + 38_633_472)
    assert (report.total.matmul_flops - expected).expand() == 0


@pytest.mark.parametrize(("batch", "seq"), SIZES)
def test_evaluated_report_equals_a_concrete_analysis_per_module(symbolic, batch, seq):
    make, report = symbolic
    evaluated = report.evaluate(batch=batch, seq=seq)
    concrete = analyze(*make(batch, seq))
    assert evaluated.total == concrete.total
    assert evaluated.by_module() == concrete.by_module()
    assert ({m.path: m.exclusive for m in evaluated.modules}
            == {m.path: m.exclusive for m in concrete.modules})
    # The dynamic graph also reads sizes (aten.sym_size.int, free); every op that costs
    # something is in both, with the same cost.
    costly = {op: s.cost for op, s in evaluated.by_operator().items() if s.cost.flops}
    assert costly == {op: s.cost for op, s in concrete.by_operator().items() if s.cost.flops}


def test_sweep_evaluates_each_point(symbolic):
    make, report = symbolic
    points = report.sweep(batch=[1, 2], seq=[32, 48])
    assert [p.total for p in points] == [analyze(*make(1, 32)).total,
                                          analyze(*make(2, 48)).total]


def test_sizes_outside_the_exported_range_are_refused(symbolic):
    _, report = symbolic
    with pytest.raises(ValueError, match="seq=4096 is outside the range"):
        report.evaluate(seq=4096)
    with pytest.raises(KeyError, match="no dynamic size width"):
        report.evaluate(width=3)


def test_a_formula_that_needs_concrete_sizes_is_reported_not_crashed():
    def needs_int(call):
        return Cost(flops=int(call.out.numel))  # int() of a symbolic size raises

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(4, 8)
    report = analyze(model, (x,), dynamic_shapes=({0: Dim("rows", max=100)},),
                     formulas={torch.ops.aten.gelu.default: needs_int})
    [failed] = report.uncounted
    assert failed.op == "aten.gelu.default" and failed.modules == ["1"]
    assert "TypeError" in failed.reason
    assert report.module("0").inclusive.macs.free_symbols  # the rest is still counted


def test_an_unbounded_dim_has_no_maximum():
    from tests.models import TwoLayerMLP

    report = analyze(TwoLayerMLP(), (torch.randn(4, 32),), dynamic_shapes=({0: Dim("batch")},))
    [batch] = report.symbols
    assert batch.max is None
    # TwoLayerMLP(32, 64, 10): batch * (32*64 + 64*10) MACs.
    assert report.evaluate(batch=1000).total.macs == 1000 * (32 * 64 + 64 * 10)


_S, _T = (size_symbol(name) for name in ("s", "t"))


@pytest.mark.parametrize("constant, coefficients", [
    (0, {_S: 3}),
    (5, {_S: 3, _S ** 2: -2}),
    (0, {_S: 1}),
    (7, {}),
    (0, {_S * _T: 4, _S: 1, _T ** 3: sympy.Rational(1, 2)}),
    (-3, {_S ** 2 * _T: 12, sympy.S.One: 4}),
    (0, {_S: 0}),
    (0, {sympy.Function("f")(_S): 3, _S: 2}),
    (1, {sympy.floor(_S / 2): 3, 1 / _S: -1}),
])
def test_a_sum_of_like_terms_is_the_expression_sympy_makes(constant, coefficients):
    """`polynomial` builds the sum without sympy's product machinery: it must be the very
    expression sympy.Add makes of the same terms (equal, same tree, same hash)."""
    expected = sympy.Add(constant, *(c * m for m, c in coefficients.items()))
    made = polynomial(constant, coefficients)
    assert made == expected and hash(made) == hash(expected)
    assert sympy.srepr(made) == sympy.srepr(expected)
