"""Ops with no formula of their own, counted through torch's decomposition; zero-cost per
overload; complex arithmetic. Every expected count is derived by hand from the op's semantics."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

from exportflops import analyze
from exportflops.formulas.registry import FormulaTable, absent_ops, aten_ops
from tests.models import Call


def _node(report, op: str):
    (node,) = [n for n in report.nodes if n.op == op]
    return node


# (id, function, inputs, op in the graph, FLOPs, MACs), each derived in its comment.
DECOMPOSED = [
    # outer(a[4], b[5]): a view and one multiply per output element: 4*5 = 20 FLOPs, no MAC.
    ("outer", torch.outer, (torch.randn(4), torch.randn(5)), "aten.outer.default", 20, 0),
    # kron(a[4], b[5]): the same 4*5 products, laid out as one vector.
    ("kron", torch.kron, (torch.randn(4), torch.randn(5)), "aten.kron.default", 20, 0),
    # multiply is mul: 4*5 = 20 products.
    ("multiply", torch.multiply, (torch.randn(4, 5), torch.randn(4, 5)),
     "aten.multiply.Tensor", 20, 0),
    # tensordot(x[2,3,4], y[4,5], dims=1): one mm (2*3, 4) x (4, 5) = 6*5*4 = 120 MACs.
    ("tensordot", lambda x, y: torch.tensordot(x, y, dims=1),
     (torch.randn(2, 3, 4), torch.randn(4, 5)), "aten.tensordot.default", 240, 120),
    # inner(x[2,3,4], y[5,4]): every (2*3) row with every 5 row over 4: 6*5*4 = 120 MACs.
    ("inner", torch.inner, (torch.randn(2, 3, 4), torch.randn(5, 4)), "aten.inner.default",
     240, 120),
    # multi_dot of A[2,3] B[3,4] C[4,5]: the cheaper order (AB)C = 2*3*4 + 2*4*5 = 64 MACs
    # (A(BC) would be 3*4*5 + 2*3*5 = 90).
    ("multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]),
     (torch.randn(2, 3), torch.randn(3, 4), torch.randn(4, 5)), "aten.linalg_multi_dot.default",
     128, 64),
    # bilinear(x1[4,3], x2[4,5], W[6,3,5], b[6]) = x1 W x2 + b, as torch pairs it: x1 with W over
    # i (4*6*3*5 = 360 MACs), then with x2 over j (4*6*5 = 120 MACs); bias 4*6 = 24 adds.
    # FLOPs: 2*480 + 24 = 984.
    ("bilinear", F.bilinear, (torch.randn(4, 3), torch.randn(4, 5), torch.randn(6, 3, 5),
                              torch.randn(6)), "aten.bilinear.default", 984, 480),
    # cdist(x1[1,4,3], x2[1,5,3]), p=2, few rows (no mm path): 4*5 pairs, each 3 subtracts,
    # 3 squares and 3 adds, and one root: 20 * (3*3 + 1) = 200.
    ("cdist", torch.cdist, (torch.randn(1, 4, 3), torch.randn(1, 5, 3)), "aten.cdist.default",
     200, 0),
    # mse_loss(a[6], b[6]), mean: 6 subtracts, 6 squares, 6 adds and 1 divide = 19.
    ("mse_loss", F.mse_loss, (torch.randn(6), torch.randn(6)), "aten.mse_loss.default", 19, 0),
    # addr(M[3,5], v[3], w[5]) = M + v w^T, beta = alpha = 1: 3*5 = 15 products; torch's
    # decomposition also scales by alpha and beta (15 + 15 multiplies) before the 15 adds: 60.
    ("addr", torch.addr, (torch.randn(3, 5), torch.randn(3), torch.randn(5)),
     "aten.addr.default", 60, 0),
]


@pytest.mark.parametrize(("function", "inputs", "op", "flops", "macs"),
                         [case[1:] for case in DECOMPOSED], ids=[case[0] for case in DECOMPOSED])
def test_an_op_without_a_formula_is_counted_through_its_decomposition(function, inputs, op,
                                                                        flops, macs):
    report = analyze(Call(function), inputs)
    node = _node(report, op)
    assert (node.status, node.cost.flops, node.cost.macs) == ("counted", flops, macs)
    assert node.note.startswith("counted through its decomposition into")
    assert node.module == "" and report.uncounted == []


def test_a_decomposition_that_only_moves_data_is_free_with_its_note():
    """type_as to another dtype is a copy (_to_copy); tile is repeat; concat is cat."""
    x, y = torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64)
    report = analyze(Call(lambda a, b: (a.type_as(b), a.tile(2, 1), torch.concat([a, a]))), (x, y))
    for op in ("aten.type_as.default", "aten.tile.default", "aten.concat.default"):
        node = _node(report, op)
        assert node.status == "zero" and node.cost.flops == 0
        assert "decomposition" in node.note
    assert report.uncounted == []


def test_a_decomposed_count_keeps_dynamic_sizes():
    """outer(a[n], b[n]) with n dynamic: n*n multiplies; mse_loss: 3n + 1."""
    n = torch.export.Dim("n", min=2)
    report = analyze(Call(lambda a, b: (torch.outer(a, b), F.mse_loss(a, b))),
                     (torch.randn(5), torch.randn(5)), dynamic_shapes=(({0: n}, {0: n}),))
    size = sympy.Symbol("n", positive=True, integer=True)
    assert sympy.simplify(_node(report, "aten.outer.default").cost.flops - size**2) == 0
    assert sympy.simplify(_node(report, "aten.mse_loss.default").cost.flops - (3 * size + 1)) == 0
    assert report.evaluate(n=7).total.flops == 7 * 7 + 3 * 7 + 1


def test_addbmm_sums_the_batch_of_products():
    """addbmm(M[3,5], b1[4,3,2], b2[4,2,5]): 4*3*5*2 = 120 MACs, then M added: 15 adds."""
    report = analyze(Call(torch.addbmm),
                     (torch.randn(3, 5), torch.randn(4, 3, 2), torch.randn(4, 2, 5)))
    assert (report.total.macs, report.total.flops) == (120, 2 * 120 + 15)


@pytest.mark.parametrize(("reduce", "flops"), [("add", 6), ("multiply", 6), (None, 0)])
def test_scatter_is_arithmetic_only_when_it_reduces(reduce, flops):
    """index[2,3]: with reduce, one add or multiply per index position (2*3 = 6); without,
    plain scatter moves data."""
    kwargs = {} if reduce is None else {"reduce": reduce}
    report = analyze(Call(lambda x, i, s: x.scatter(0, i, s, **kwargs)),
                     (torch.randn(4, 3), torch.zeros(2, 3, dtype=torch.long), torch.randn(2, 3)))
    assert report.total.flops == flops and report.uncounted == []


def test_index_put_with_accumulate_adds_each_value():
    """x[idx] += v with accumulate=True: 3 values of 4 elements = 12 adds."""
    report = analyze(Call(lambda x, i, v: x.index_put((i,), v, accumulate=True)),
                     (torch.randn(5, 4), torch.tensor([0, 1, 1]), torch.randn(3, 4)))
    assert report.total.flops == 12


def test_a_misspelt_op_name_in_a_table_is_listed_as_absent_not_dropped_silently():
    # The table loads on a torch that lacks an op, so a misspelt name cannot fail the import:
    # it is recorded as absent, and tests/test_torch_releases.py fails on any absent name not
    # known removed from this torch.
    table = FormulaTable()
    table.register_zero(aten_ops("mull", "scatter.srcc"), "a reason", moves="nothing")
    assert absent_ops(table) == ["aten.mull", "aten.scatter.srcc"]


def test_complex_arithmetic_is_counted_in_real_operations():
    """complex64: A[2,3] @ B[3,4] is 2*4*3 = 24 complex MACs = 4*24 = 96 real MACs (each
    (a+bi)(c+di) accumulated: 4 multiplies, 4 adds), 192 FLOPs; x*y over 5 elements: 4
    multiplies + 2 adds each = 30; x+y: 2 adds each = 10."""
    c = torch.complex64
    report = analyze(Call(lambda a, b, x, y: (a @ b, x * y, x + y)),
                     (torch.randn(2, 3, dtype=c), torch.randn(3, 4, dtype=c),
                      torch.randn(5, dtype=c), torch.randn(5, dtype=c)))
    assert _node(report, "aten.matmul.default").cost.macs == 96
    assert _node(report, "aten.matmul.default").cost.flops == 192
    assert _node(report, "aten.mul.Tensor").cost.flops == 30
    assert _node(report, "aten.add.Tensor").cost.flops == 10


def test_complex_convolution_counts_four_real_macs_per_complex_mac():
    """Conv1d 2 -> 3 channels, kernel 3, on 8 positions (6 outputs), no bias, complex64:
    6*3 outputs x 2*3 weights = 108 complex MACs = 432 real MACs."""
    conv = nn.Conv1d(2, 3, 3, bias=False, dtype=torch.complex64)
    report = analyze(conv, (torch.randn(1, 2, 8, dtype=torch.complex64),))
    assert report.total.macs == 4 * 6 * 3 * 2 * 3


def test_a_backward_op_without_a_formula_is_counted_through_its_decomposition():
    """mse_loss(x @ w, y) over 3*5 = 15 elements in train mode: mse_loss_backward is
    (x - y) * (2 / 15) * grad, 3 ops per element = 45 FLOPs."""

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 5))

        def forward(self, x, y):
            return F.mse_loss(x @ self.w, y)

    report = analyze(Loss(), (torch.randn(3, 4), torch.randn(3, 5)), mode="train")
    node = _node(report, "aten.mse_loss_backward.default")
    assert (node.status, node.cost.flops, node.phase) == ("counted", 45, "backward")
    assert report.uncounted == []


def test_an_op_with_neither_formula_nor_decomposition_stays_uncounted():
    """A library's op (conftest's doubled) has its own kernel and no decomposition in torch:
    reported, not zero."""
    report = analyze(Call(torch.ops.exportflops_tests.doubled), (torch.randn(4),))
    node = _node(report, "exportflops_tests.doubled.default")
    assert (node.status, node.note) == ("uncounted", "no formula")
    assert [u.op for u in report.uncounted] == ["exportflops_tests.doubled.default"]
