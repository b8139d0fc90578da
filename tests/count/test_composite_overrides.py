"""A formula given for an op applies to the composite ops that run it: export's graph keeps
``aten.matmul`` where the dispatcher (and ``FlopCounterMode``) sees the ``aten.mm`` it runs.
Without a formula of the user's, composites keep their built-in formulas."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import Cost, analyze, register_formula
from exportflops.formulas import FORMULAS
from exportflops.torch_internals import TorchDispatchMode
from tests.models import Call

aten = torch.ops.aten
SEVEN = {aten.mm.default: lambda call: Cost(flops=7)}
"""A formula no built-in gives: 7 FLOPs for every mm, whatever its sizes."""


def matmul():
    return Call(torch.matmul)


class Dispatched(TorchDispatchMode):
    """The ATen ops eager torch dispatches, as a dispatch-level counter sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


# (id, x shape, y shape, formulas, FLOPs), each derived in its comment.
CASES = [
    # 2-D x.matmul(y) is one aten.mm at the dispatcher: the user's 7.
    ("2d_mm", (3, 4), (4, 5), SEVEN, 7),
    # The packet aten.mm keys every overload of mm the same way.
    ("2d_mm_packet", (3, 4), (4, 5), {aten.mm: lambda call: Cost(flops=7)}, 7),
    # (2, 3, 4) @ (4, 5): torch folds the batch into the rows of one mm, (6, 4) @ (4, 5), between
    # two views (no FLOPs): the user's 7.
    ("3d_by_2d_folds_into_one_mm", (2, 3, 4), (4, 5), SEVEN, 7),
    # (2, 3, 4) @ (2, 4, 5) runs a bmm, no mm: the built-in matmul formula, 2 batches x 3 rows
    # x 5 columns x 4 MACs each = 120 MACs = 240 FLOPs.
    ("3d_by_3d_is_a_bmm", (2, 3, 4), (2, 4, 5), SEVEN, 2 * 2 * 3 * 5 * 4),
    # The same with a formula for bmm: one bmm (between views and expands, no FLOPs): 11.
    ("3d_by_3d_bmm_formula", (2, 3, 4), (2, 4, 5), {aten.bmm.default: lambda call: Cost(flops=11)},
     11),
]


@pytest.mark.parametrize("xs, ys, formulas, flops", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_formula_for_mm_counts_the_matmuls_that_run_one(xs, ys, formulas, flops):
    x, y = torch.randn(xs), torch.randn(ys)
    report = analyze(matmul(), (x, y), formulas=formulas)
    assert report.total.flops == flops
    # The node keeps its op: the row is matmul's, with the user's count.
    assert list(report.by_operator()) == ["aten.matmul.default"]
    assert report.uncounted == []


@pytest.mark.parametrize("xs, ys, formulas", [c[1:4] for c in CASES], ids=[c[0] for c in CASES])
def test_the_users_formula_applies_exactly_where_eager_torch_runs_its_op(xs, ys, formulas):
    """Against torch's own dispatch, not our decomposition: the node goes through the user's
    formula if and only if eager ``x.matmul(y)`` dispatches the op it was given for."""
    x, y = torch.randn(xs), torch.randn(ys)
    with Dispatched() as dispatched:
        torch.matmul(x, y)
    (node,) = analyze(matmul(), (x, y), formulas=formulas).nodes
    given = {op if isinstance(op, torch._ops.OpOverload) else op.default for op in formulas}
    runs_given = bool(given & set(dispatched.ops))
    assert ("the formula given for" in node.note) == runs_given


# matmul's built-in formula: (3, 4) @ (4, 5) is 3 x 5 x 4 = 60 MACs = 120 FLOPs; (2, 3, 4) @
# (4, 5) and (2, 3, 4) @ (2, 4, 5) are both 2 x 3 x 5 x 4 = 120 MACs = 240 FLOPs.
BUILT_IN = [((3, 4), (4, 5), 120), ((2, 3, 4), (4, 5), 240), ((2, 3, 4), (2, 4, 5), 240)]


@pytest.mark.parametrize("formulas", [None, {aten.gelu.default: lambda call: Cost(flops=1)}],
                         ids=["no_formulas", "a_formula_the_matmul_never_runs"])
@pytest.mark.parametrize("xs, ys, flops", BUILT_IN, ids=["2d", "3d_by_2d", "3d_by_3d"])
def test_without_a_formula_for_what_it_runs_a_matmul_keeps_its_built_in_count(xs, ys, flops,
                                                                              formulas):
    (node,) = analyze(matmul(), (torch.randn(xs), torch.randn(ys)), formulas=formulas).nodes
    assert (node.op, node.cost.flops, node.cost.macs, node.note) == \
        ("aten.matmul.default", flops, flops // 2, "")


def test_an_op_with_a_kernel_of_its_own_is_not_decomposed_for_a_users_formula():
    # gelu has a kernel: FlopCounterMode sees one gelu call, whatever formula mul has. Its
    # count is the same with a formula for the mul its torch._decomp entry runs as without.
    model, args = nn.GELU(), (torch.randn(4, 8),)
    plain = analyze(model, args)
    given = analyze(model, args, formulas={aten.mul.Tensor: lambda call: Cost(flops=1)})
    assert [(n.op, n.cost, n.note) for n in given.nodes] == \
        [(n.op, n.cost, n.note) for n in plain.nodes]


def test_a_formula_registered_for_mm_counts_the_matmul_too():
    register_formula(aten.mm.default, replace=True)(SEVEN[aten.mm.default])
    try:
        report = analyze(matmul(), (torch.randn(3, 4), torch.randn(4, 5)))
    finally:
        FORMULAS.remove(aten.mm.default)
    assert report.total.flops == 7
    # The built-in mm formula is back: (3, 4) @ (4, 5) = 60 MACs = 120 FLOPs.
    assert analyze(matmul(), (torch.randn(3, 4), torch.randn(4, 5))).total.flops == 120


class TimesWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 5))

    def forward(self, x):
        return x.matmul(self.weight)


def test_in_train_mode_the_forward_and_backward_mms_take_the_users_formula():
    # Forward: x (3, 4) @ weight (4, 5), one mm: 7. Backward: only the weight needs a gradient,
    # x^T (4, 3) @ grad (3, 5), one mm: 7 (x needs none, so no grad @ weight^T).
    report = analyze(TimesWeight(), (torch.randn(3, 4),), mode="train", formulas=SEVEN)
    assert (report.forward.flops, report.backward.flops) == (7, 7)


def test_a_users_formula_that_fails_inside_a_composite_is_an_error_not_the_built_in_count():
    def fails(call):
        raise ValueError("no estimate for this shape")

    (node,) = analyze(matmul(), (torch.randn(3, 4), torch.randn(4, 5)),
                      formulas={aten.mm.default: fails}).nodes
    assert node.status == "error" and "no estimate for this shape" in node.note
    assert node.cost == Cost()
