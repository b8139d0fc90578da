"""The backward split as torch's zero-bubble pipeline schedules run it: the input-gradient pass
(``stage_backward_input``: autograd asked for the inputs' gradients only) and the weight-gradient
pass (``stage_backward_weight``: the parameters' from the gradients saved on the way), from
torch/distributed/pipelining/_backward.py.

A Linear y = x W^T + b on (B, in) -> (B, out): grad_x = grad_y @ W, B*out*in MACs, is on the way
to x's gradient (the input pass); grad_W = grad_y^T @ x, out*B*in MACs, and grad_b, B*out adds,
are the parameters' (the weight pass). An op computed from parameters alone (a scaled weight)
differentiates in the weight pass only.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
import torch.nn.attention.flex_attention as flex_module
from torch.export import Dim
from torch.nn.attention.flex_attention import flex_attention

from exportflops import analyze
from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.records import Report

B, IN, HIDDEN, OUT = 8, 32, 16, 4


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class ScaledWeight(nn.Module):
    """y = x @ (2 w): the scaling reads the parameter alone."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(IN, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.w * 2)


def halves(report: Report) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for node in report.nodes:
        if node.phase == "backward":
            found.setdefault(node.gradient, []).append(node.op)
    return found


def test_an_input_that_needs_a_gradient_puts_each_grad_x_in_the_input_pass():
    x = torch.randn(B, IN, requires_grad=True)
    report = analyze(TwoLinears(), (x,), mode="train", split_backward=True)
    # Input pass: grad_x of down (B*out*hidden), relu's mask, grad_x of up (B*hidden*in).
    assert report.backward_input.macs == B * OUT * HIDDEN + B * HIDDEN * IN
    # Weight pass: grad_W of down (out*B*hidden) and of up (hidden*B*in).
    assert report.backward_weight.macs == OUT * B * HIDDEN + HIDDEN * B * IN
    assert "aten.threshold_backward.default" in halves(report)["input"]
    assert "aten.threshold_backward.default" not in halves(report)["weight"]
    assert set(halves(report)) == {"input", "weight"}
    # Two passes of a linear stack do no work twice: they add up to the whole backward.
    whole = analyze(TwoLinears(), (x,), mode="train")
    assert report.backward == whole.backward and whole.backward_weight is None


def test_inputs_without_a_gradient_leave_the_whole_backward_to_the_weight_pass():
    # A pipeline's first stage (token ids): torch runs its whole backward in the weight pass.
    report = analyze(TwoLinears(), (torch.randn(B, IN),), mode="train", split_backward=True)
    assert report.backward_input.macs == 0
    # grad_W of both, and grad_x of down (up's output needs one for up's weight).
    assert report.backward_weight.macs == OUT * B * HIDDEN + B * OUT * HIDDEN + HIDDEN * B * IN
    assert set(halves(report)) == {"weight"}


def test_an_op_of_parameters_alone_differentiates_in_the_weight_pass():
    x = torch.randn(B, IN, requires_grad=True)
    report = analyze(ScaledWeight(), (x,), mode="train", split_backward=True)
    assert report.backward_input.macs == B * OUT * IN  # grad_x = grad_y @ (2w)^T
    assert report.backward_weight.macs == IN * B * OUT  # grad_(2w) = x^T @ grad_y
    scaling = [n for n in report.nodes if n.differentiates == "mul"]
    assert scaling and {n.gradient for n in scaling} == {"weight"}


def test_an_op_with_operands_of_both_kinds_runs_once_in_each_pass():
    x = torch.randn(B, IN, requires_grad=True)
    report = analyze(nn.LayerNorm(IN), (x,), mode="train", split_backward=True)
    kernels = [n for n in report.nodes if n.op == "aten.native_layer_norm_backward.default"]
    assert sorted(n.gradient for n in kernels) == ["input", "weight"]
    # The input pass asks for x's gradient only, the weight pass for the weight's and bias's.
    by_half = {n.gradient: n for n in kernels}
    assert by_half["input"].outputs[0].shape == [B, IN]
    assert len(by_half["weight"].outputs) == 2
    assert len({n.name for n in report.nodes}) == len(report.nodes)


def test_the_split_keeps_through_dynamic_sizes_json_and_repeated_blocks():
    x = torch.randn(B, IN, requires_grad=True)
    batch = Dim("batch", min=2, max=64)
    report = analyze(TwoLinears(), (x,), mode="train", split_backward=True,
                     dynamic_shapes=({0: batch},))
    at = report.evaluate(batch=3)
    assert at.backward_weight.macs == OUT * 3 * HIDDEN + HIDDEN * 3 * IN
    assert Report.model_validate_json(at.model_dump_json()) == at
    stack = nn.Sequential(*(nn.Linear(IN, IN) for _ in range(3)))
    fast = analyze(stack, (x,), mode="train", split_backward=True)
    full = analyze(stack, (x,), mode="train", split_backward=True, fast=False)
    assert fast.backward_weight == full.backward_weight
    assert fast.backward_weight.macs == 3 * IN * B * IN
    assert fast.backward_input.macs == 3 * B * IN * IN


class SharedLinear(nn.Module):
    """a(tanh(a(x))): one weight used twice on the way to x's gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(IN, IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.tanh(self.a(x)))


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(IN, IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=True)


@pytest.mark.parametrize(("model", "match"), [
    # torch's weight pass restarts from both uses and recomputes the input-gradient ops between.
    (SharedLinear(), "used at 2 ops"),
    # torch.utils.checkpoint refuses .grad(), which the input pass is.
    (Checkpointed(), "activation checkpoint"),
], ids=["a-weight-used-twice", "checkpointing"])
def test_what_the_two_passes_run_otherwise_is_refused(model, match):
    x = torch.randn(B, IN, requires_grad=True)
    with pytest.raises(InputError, match=match):
        analyze(model, (x,), mode="train", split_backward=True)
    assert analyze(model, (x,), mode="train").backward.macs > 0  # unsplit, it counts


class BiasedFlex(nn.Module):
    """Flex attention over 2 heads of 16 with a learned bias per head in its score_mod."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(2))
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s + self.bias[h])


def test_a_kernel_with_operands_of_both_kinds_runs_in_both_passes(monkeypatch):
    # torch's cpu kernel has no flex backward and refuses before tracing; export runs none.
    monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)
    x = torch.randn(1, 2, 8, 16, requires_grad=True)
    report = analyze(BiasedFlex(), (x,), mode="train", split_backward=True)
    # One kernel computes the query's, key's, value's and the bias's gradients: the input pass
    # runs it for the first three, the weight pass again for the bias.
    kernels = [n for n in report.nodes if "flex_attention_backward" in n.op]
    assert sorted(n.gradient for n in kernels) == ["input", "weight"]
    assert kernels[0].cost == kernels[1].cost
    assert len({n.name for n in report.nodes}) == len(report.nodes)


def test_a_split_with_no_backward_op_has_an_empty_weight_pass():
    report = analyze(nn.ReLU(), (torch.randn(B, IN),), mode="train", split_backward=True)
    assert report.backward_weight.flops == 0 and report.backward_input.flops == 0


def test_the_split_takes_train_mode():
    with pytest.raises(InputError, match="mode='train'"):
        analyze(TwoLinears(), (torch.randn(B, IN),), split_backward=True)


def test_the_command_shows_both_passes(capsys):
    assert main(["gpt2", "--mode", "train", "--split-backward", "--view", "summary"]) == 0
    assert "backward: input / weight pass" in capsys.readouterr().out
    assert main(["gpt2", "--split-backward"]) == 2
    assert "--mode train" in capsys.readouterr().err
