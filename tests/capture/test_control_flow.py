"""Control flow captured by torch.export: cond, map and while_loop, counted by hand.

Every Linear here is Linear(4, 4) on 2 rows: 2 * 4 * 4 = 32 MACs, 2 * 32 + 2 * 4 (bias) = 72
FLOPs per call.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._higher_order_ops.map import map as map_over
from torch._higher_order_ops.while_loop import while_loop

from exportflops import analyze
from exportflops.errors import UncountedOpError

LINEAR_MACS, LINEAR_FLOPS = 2 * 4 * 4, 2 * 2 * 4 * 4 + 2 * 4


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a(x), lambda x: self.b(x).relu(), (x,))


def test_cond_counts_and_lists_both_branches():
    """Which branch runs is decided at run time: both are counted (the total is their sum, an
    upper bound for one call) and each of their ops names its branch."""
    report = analyze(Branches(), (torch.randn(2, 4),))
    assert report.total.macs == 2 * LINEAR_MACS
    notes = {n.name: n.note for n in report.nodes}
    assert notes["cond.true_graph_0.linear"] == "cond cond, true_graph_0"
    assert notes["cond.false_graph_0.linear"] == "cond cond, false_graph_0"
    assert notes["cond.false_graph_0.relu"] == "cond cond, false_graph_0"
    assert report.uncounted == []


class MapBody(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, xs):
        return map_over(lambda x: self.a(x), xs)


def test_map_counts_its_body_once_per_slice():
    report = analyze(MapBody(), (torch.randn(5, 2, 4),))
    assert report.total.macs == 5 * LINEAR_MACS
    [body] = [n for n in report.nodes if n.op == "aten.linear.default"]
    assert body.note == "map_impl map_impl, body_graph_0, x5"


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, i, x):
        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, self.a(x)), (i, x))


def test_while_loop_is_reported_with_its_cost_per_iteration_not_guessed():
    report = analyze(Loop(), (torch.tensor(0), torch.randn(2, 4)))
    assert report.total.macs == 0
    uncounted = {u.op: u.reason for u in report.uncounted}
    assert set(uncounted) == {"aten.lt.Scalar", "aten.add.Tensor", "aten.linear.default"}
    assert "trip count not known at export" in uncounted["aten.linear.default"]
    assert f"{LINEAR_FLOPS} FLOPs per run" in uncounted["aten.linear.default"]
    assert report.coverage < 1


def test_train_mode_reports_the_untraced_backward_of_control_flow():
    report = analyze(Branches(), (torch.randn(2, 4),), mode="train")
    [untraced] = report.uncounted
    assert untraced.op == "higher_order.cond"
    assert "backward of control flow" in untraced.reason


def test_strict_refuses_an_unknown_trip_count():
    with pytest.raises(UncountedOpError, match="trip count"):
        analyze(Loop(), (torch.tensor(0), torch.randn(2, 4)), strict=True)


class FrozenFeatures(nn.Module):
    """A feature extractor run under torch.no_grad(), then a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.features, self.head = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            features = self.features(x)
        return self.head(features)


def test_a_no_grad_region_runs_once_and_needs_no_gradient():
    """Forward: both linears once (2 x 32 MACs). Backward: the head's weight gradient only
    (its input comes from the no_grad region, the data needs none): 32 MACs."""
    report = analyze(FrozenFeatures(), (torch.randn(2, 4),), mode="train")
    assert report.uncounted == []
    assert report.forward.macs == 2 * LINEAR_MACS
    assert report.backward.macs == LINEAR_MACS


class _Region(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return torch.relu(self.proj(x))


class _Regions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Region() for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_invoke_subgraph_bodies_are_charged_to_each_calling_module(mode):
    # Strict export keeps a nested_compile_region as one invoke_subgraph body for the calls after
    # the first (torch 2.13 inlines the first); its nodes carry the first call's module stack.
    x = torch.randn(4, 8, requires_grad=mode == "train")
    program = torch.export.export(_Regions(), (x,), strict=True)
    assert any(n.target is torch.ops.higher_order.invoke_subgraph for n in program.graph.nodes)
    report = analyze(program, (x,), mode=mode)
    # Each block: a Linear(8, 8) on 4 rows, 4 x 8 x 8 = 256 MACs forward; in train mode the
    # input and weight gradients, 2 x 256 more.
    forward, backward = 256, (512 if mode == "train" else 0)
    modules = {m.path: m for m in report.modules}
    for i in range(3):
        for path in (f"blocks.{i}", f"blocks.{i}.proj"):
            assert modules[path].calls == 1
            assert modules[path].inclusive.macs == forward + backward, path
    assert report.total.macs == 3 * (forward + backward)
    assert not any("_export_root" in path for path in modules)


class Vmapped(nn.Module):
    """``torch.vmap`` over the rows: export records the Linear on one row's shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return torch.vmap(self.a)(x)


def test_vmap_counts_each_batched_op_once_per_sample():
    """2 rows, vmapped: the Linear is recorded on (4,) but runs for both rows, one Linear on 2
    rows (72 FLOPs). Nested, vmap(vmap) over 3 x 2 rows: 3 times that. Train mode: the weight's
    gradient on 2 rows, 32 MACs, and the bias's, 2 x 4 adds (the input needs none)."""
    assert analyze(Vmapped(), (torch.randn(2, 4),)).total.flops == LINEAR_FLOPS
    nested = Vmapped()
    nested.forward = lambda x: torch.vmap(torch.vmap(nested.a))(x)
    assert analyze(nested, (torch.randn(3, 2, 4),)).total.flops == 3 * LINEAR_FLOPS
    train = analyze(Vmapped(), (torch.randn(2, 4),), mode="train")
    assert (train.backward.macs, train.backward.flops) == (LINEAR_MACS, 2 * LINEAR_MACS + 8)


def test_vmap_runs_an_op_on_unbatched_tensors_once():
    """vmap(x @ (w * 2), in_dims=(0, None)) over 5 rows of 3, w 3 x 2: w * 2 (6 FLOPs) touches
    no batched value and runs once; the product runs per row, 5 * 3 * 2 = 30 MACs."""

    class Scaled(nn.Module):
        def forward(self, x, w):
            return torch.vmap(lambda row, w: row @ (w * 2), in_dims=(0, None))(x, w)

    report = analyze(Scaled(), (torch.randn(5, 3), torch.randn(3, 2)))
    assert (report.total.macs, report.total.flops) == (30, 60 + 6)
