"""Train mode's rules: what needs a gradient, whatever grad mode the call is made in.

Every Linear here is Linear(4, 4) on 2 rows: forward 2 * 4 * 4 = 32 MACs. Its backward is
grad_W = grad_y^T @ x (4 x 2 x 4 = 32 MACs) when its weight is trained, grad_x = grad_y @ W
(2 x 4 x 4 = 32 MACs) when its input needs a gradient, and grad_b = the sum of grad_y over the
2 rows (2 * 4 adds) when its bias is trained.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from exportflops import analyze
from exportflops.errors import ExportError, UncountedOpError

ROWS, WIDTH = 2, 4
LINEAR_MACS = ROWS * WIDTH * WIDTH  # one contraction of a (2, 4) by a (4, 4)
BIAS_GRAD_FLOPS = ROWS * WIDTH  # grad_b: 2 rows of 4 summed


class TwoLinears(nn.Module):
    """a feeds b; the data needs no gradient, so a computes grad_W only and b both."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.b(self.a(x))


# a: grad_W; b: grad_W and grad_x. Both biases trained.
TWO_LINEARS_BACKWARD_MACS = LINEAR_MACS + 2 * LINEAR_MACS


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode],
                         ids=["no_grad", "inference_mode"])
def test_train_mode_counts_the_backward_whatever_the_callers_grad_mode(context):
    model = TwoLinears()
    with context():
        x = torch.randn(ROWS, WIDTH)
        report = analyze(model, (x,), mode="train")
    assert report.uncounted == []
    assert report.backward.macs == TWO_LINEARS_BACKWARD_MACS
    assert report.backward.flops == 2 * TWO_LINEARS_BACKWARD_MACS + 2 * BIAS_GRAD_FLOPS


class FrozenFeatures(nn.Module):
    """A feature extractor under torch.no_grad(), then a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.features, self.head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        with torch.no_grad():
            features = self.features(x)
        return self.head(features)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode],
                         ids=["no_grad", "inference_mode"])
def test_the_models_own_no_grad_region_stays_gradient_free_under_an_outer_one(context):
    """Under an outer no_grad the inner one changes nothing while exporting: it must still be
    seen. Backward: the head's weight and bias gradients only (32 MACs, 8 adds)."""
    model = FrozenFeatures()
    with context():
        report = analyze(model, (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.module("features").backward.flops == 0
    assert report.backward.macs == LINEAR_MACS
    assert report.backward.flops == 2 * LINEAR_MACS + BIAS_GRAD_FLOPS


def test_a_model_built_in_inference_mode_cannot_be_trained_and_says_so():
    """Its parameters are inference tensors, which autograd refuses: a typed error, not 0."""
    with torch.inference_mode():
        model = TwoLinears()
        with pytest.raises(ExportError, match="(?i)inference"):
            analyze(model, (torch.randn(ROWS, WIDTH),), mode="train")


class DetachedBranch(nn.Module):
    """l(x) + m(x).detach(): autograd never reaches m."""

    def __init__(self) -> None:
        super().__init__()
        self.l, self.m = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.l(x) + self.m(x).detach()


def test_detach_stops_the_gradient():
    """Backward: the add passes its gradient to l only (no arithmetic), and l computes grad_W
    (the data needs none) and grad_b: 32 MACs, 2 * 32 + 8 FLOPs. m: nothing."""
    report = analyze(DetachedBranch(), (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.uncounted == []
    assert report.module("m").backward.flops == 0
    assert not [n for n in report.nodes if n.phase == "backward" and n.module == "m"]
    assert report.backward.macs == LINEAR_MACS
    assert report.backward.flops == 2 * LINEAR_MACS + BIAS_GRAD_FLOPS


NO_GRADIENT = {
    "detach": lambda h, y: y * h.detach(),
    "comparison": lambda h, y: y * (h > 0).to(y.dtype),
    "argmax": lambda h, y: y * h.argmax(-1, keepdim=True).to(y.dtype),
    "index": lambda h, y: y.gather(-1, h.argmax(-1, keepdim=True)),
    "zeros_like": lambda h, y: y + torch.zeros_like(h),
    "integer_cast": lambda h, y: y * h.long(),
}


class Blocked(nn.Module):
    """y = l(x) combined with m(x) through an op that passes m no gradient."""

    def __init__(self, combine) -> None:
        super().__init__()
        self.l, self.m = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.combine = combine

    def forward(self, x):
        return self.combine(self.m(x), self.l(x))


@pytest.mark.parametrize("combine", list(NO_GRADIENT.values()), ids=list(NO_GRADIENT))
def test_no_gradient_flows_through_detach_comparisons_integers_or_indices(combine):
    """m's output reaches the loss only through values autograd does not differentiate, so m
    has no backward at all; l still computes its weight gradient (32 MACs)."""
    report = analyze(Blocked(combine), (torch.randn(ROWS, WIDTH),), mode="train")
    assert not [n for n in report.nodes if n.phase == "backward" and n.module == "m"]
    assert report.module("l").backward.macs == LINEAR_MACS
    assert report.uncounted == []


class Double(torch.autograd.Function):
    """y = 2x with a hand-written backward that export cannot see."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class CallsDouble(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return Double.apply(self.l(x))


@pytest.mark.parametrize("strict_export", [False, True], ids=["non_strict", "strict"])
def test_a_custom_autograd_function_backward_is_reported_not_replaced(strict_export):
    """Export inlines Double.forward (x * 2); autograd would run Double.backward, which the
    graph does not hold. Its backward is reported uncounted, naming the Function; the mul's own
    derivative is not substituted. l, before it, is counted: grad_W 32 MACs + grad_b 8."""
    program = torch.export.export(CallsDouble(), (torch.randn(ROWS, WIDTH),),
                                  strict=strict_export)
    report = analyze(program, mode="train")
    [missing] = report.uncounted
    assert "custom torch.autograd.Function" in missing.reason and "Double" in missing.reason
    differentiated = {n.differentiates for n in report.nodes
                      if n.phase == "backward" and n.status == "counted"}
    assert differentiated == {"linear"}
    assert report.backward.macs == LINEAR_MACS
    assert report.backward.flops == 2 * LINEAR_MACS + BIAS_GRAD_FLOPS
    with pytest.raises(UncountedOpError, match="Double"):
        analyze(program, mode="train", strict=True)


class Autocast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.l(x)
        return y.float()


def test_an_autocast_region_is_differentiated_in_the_dtype_it_ran_in():
    """The linear ran in bfloat16: its weight gradient (32 MACs, the data needs none) is a
    bfloat16 mm, then cast back to the float32 parameter's dtype, as autocast's casts are
    differentiated too."""
    report = analyze(Autocast(), (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.uncounted == []
    assert report.module("l").backward.macs == LINEAR_MACS
    assert report.backward.flops == 2 * LINEAR_MACS + BIAS_GRAD_FLOPS
    [mm] = [n for n in report.nodes if n.phase == "backward" and n.op == "aten.mm.default"]
    assert {t.dtype for t in mm.inputs} == {"bfloat16"}
    casts = [n for n in report.nodes if n.phase == "backward" and n.op == "aten._to_copy.default"
             and n.module == "l"]
    assert {(tuple(c.outputs[0].shape), c.outputs[0].dtype) for c in casts} >= {
        ((WIDTH, WIDTH), "float32"), ((WIDTH,), "float32")}


class Checkpointed(nn.Module):
    """a, then b + relu under reentrant activation checkpointing, then c; a real no_grad
    region d after it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x):
        h = checkpoint(lambda t: self.b(t).relu(), self.a(x), use_reentrant=True)
        h = self.c(h)
        with torch.no_grad():
            frozen = self.d(h)
        return h + frozen


def test_activation_checkpointing_counts_its_recomputation_in_the_backward():
    """Backward, derived:
    c: grad_x and grad_W (its input comes from trained a and b): 2 x 32 MACs, grad_b 8.
    the region is recomputed: b's linear again (32 MACs, 2 * 32 + 8 FLOPs) and its relu (8).
    b: grad_x and grad_W, 2 x 32 MACs, grad_b 8; relu's gradient 8 (one select per element).
    a: grad_W only (the data needs none): 32 MACs, grad_b 8.
    d: under no_grad, nothing."""
    report = analyze(Checkpointed(), (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.uncounted == []
    recomputed = [n for n in report.nodes if n.phase == "backward" and "recomputed" in n.note]
    assert sorted(n.op for n in recomputed) == ["aten.linear.default", "aten.relu.default"]
    assert {n.module for n in recomputed if n.op == "aten.linear.default"} == {"b"}
    assert report.module("b").backward.macs == LINEAR_MACS + 2 * LINEAR_MACS
    assert report.module("c").backward.macs == 2 * LINEAR_MACS
    assert report.module("a").backward.macs == LINEAR_MACS
    assert report.module("d").backward.flops == 0
    relu = ROWS * WIDTH
    assert report.backward.flops == (
        2 * (2 * LINEAR_MACS) + BIAS_GRAD_FLOPS  # c
        + 2 * LINEAR_MACS + BIAS_GRAD_FLOPS + relu  # b's recomputed forward: linear, relu
        + 2 * (2 * LINEAR_MACS) + BIAS_GRAD_FLOPS + relu  # b's backward, relu's gradient
        + 2 * LINEAR_MACS + BIAS_GRAD_FLOPS)  # a


class StraightThrough(torch.autograd.Function):
    """A straight-through estimator: a step forward, the identity backward."""

    @staticmethod
    def forward(ctx, x):
        return (x > 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


class Binarized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.b(StraightThrough.apply(self.a(x)))


def test_a_custom_function_passes_gradients_even_through_a_comparison():
    """The comparison inside the Function blocks nothing: autograd calls the Function's
    backward. b computes grad_x and grad_W (2 x 32 MACs), a grad_W (32): 96 MACs; the
    Function's own backward is reported, not counted."""
    report = analyze(Binarized(), (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.backward.macs == 2 * LINEAR_MACS + LINEAR_MACS
    assert report.module("a").backward.macs == LINEAR_MACS
    assert report.uncounted and all("StraightThrough" in u.reason for u in report.uncounted)


class CheckpointFirst(nn.Module):
    """Reentrant checkpointing of b + relu on the raw data, then c."""

    def __init__(self) -> None:
        super().__init__()
        self.b, self.c = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.c(checkpoint(lambda t: self.b(t).relu(), x, use_reentrant=True))


def test_reentrant_checkpointing_of_inputs_without_gradient_trains_nothing_inside():
    """Reentrant checkpointing tracks its output only when a tensor passed to it needs a
    gradient: here the data does not, so b is never trained, nor recomputed (torch warns).
    c: grad_W only (its input needs none), 32 MACs and grad_b 8."""
    model = CheckpointFirst()
    with pytest.warns(UserWarning, match="requires_grad"):
        model(torch.randn(ROWS, WIDTH)).sum().backward()
    assert model.b.weight.grad is None and model.c.weight.grad is not None  # what torch does
    report = analyze(CheckpointFirst(), (torch.randn(ROWS, WIDTH),), mode="train")
    assert report.module("b").backward.flops == 0
    assert not [n for n in report.nodes if "recomputed" in n.note]
    assert report.backward.flops == 2 * LINEAR_MACS + BIAS_GRAD_FLOPS
