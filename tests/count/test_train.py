"""Train mode: backward counted from the ops autograd runs, against hand derivations.

A Linear y = x W^T + b on (B, in) -> (B, out) costs B*in*out MACs forward. Its backward:
  grad_x = grad_y @ W     : (B, out) @ (out, in) -> B*out*in MACs, only if x needs a gradient;
  grad_W = grad_y^T @ x   : (out, B) @ (B, in)   -> out*B*in MACs, only if W is trained;
  grad_b = sum of grad_y over B                  -> B*out adds, only if b is trained.
Attention's backward is four contractions (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q)
for the forward's two (q.k and p.v): twice the forward MACs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from exportflops import analyze
from exportflops.errors import UncountedOpError
from exportflops.examples.gpt2 import gpt2

B, IN, OUT = 3, 5, 7
FORWARD_MACS = B * IN * OUT  # 105


def linear_report(*, weight_grad: bool, input_grad: bool, bias_grad: bool = True):
    layer = nn.Linear(IN, OUT)
    layer.weight.requires_grad_(weight_grad)
    layer.bias.requires_grad_(bias_grad)
    return analyze(layer, (torch.randn(B, IN, requires_grad=input_grad),), mode="train")


@pytest.mark.parametrize(("weight_grad", "input_grad", "backward_macs"), [
    (True, True, B * OUT * IN + OUT * B * IN),  # grad_x and grad_W: 2x forward
    (True, False, OUT * B * IN),  # grad_W only: 1x
    (False, True, B * OUT * IN),  # grad_x only: 1x
])
def test_linear_backward_macs_follow_what_needs_a_gradient(weight_grad, input_grad, backward_macs):
    report = linear_report(weight_grad=weight_grad, input_grad=input_grad)
    assert report.forward.macs == FORWARD_MACS
    assert report.backward.macs == backward_macs
    # FLOPs: 2 per MAC, plus the bias gradient's B*out adds.
    assert report.backward.flops == 2 * backward_macs + B * OUT


def test_nothing_trained_means_no_backward():
    report = linear_report(weight_grad=False, input_grad=False, bias_grad=False)
    assert report.backward.flops == 0
    assert [n for n in report.nodes if n.phase == "backward"] == []


def test_train_forward_equals_the_forward_mode_count():
    train = linear_report(weight_grad=True, input_grad=True)
    layer = nn.Linear(IN, OUT)
    assert train.forward == analyze(layer, (torch.randn(B, IN),)).total
    assert train.mode == "train"
    assert train.backward_ratio == train.backward.flops / train.forward.flops


class ConvThenLinear(nn.Module):
    """conv (1->4 ch, 3x3, 8x8 -> 6x6), flatten, linear (144 -> 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, bias=False)
        self.head = nn.Linear(4 * 6 * 6, 10, bias=False)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def test_the_first_layer_skips_the_input_gradient():
    """The image does not require grad, so the conv computes its weight gradient only (1x);
    the head's input comes from the trained conv, so it computes both (2x)."""
    conv_macs = 2 * 4 * 6 * 6 * (1 * 3 * 3)  # batch 2, out channels x positions x kernel
    head_macs = 2 * 144 * 10
    report = analyze(ConvThenLinear(), (torch.randn(2, 1, 8, 8),), mode="train")
    assert report.module("conv").backward.macs == conv_macs
    assert report.module("head").backward.macs == 2 * head_macs
    assert report.module("conv").inclusive.macs == 2 * conv_macs


def test_attention_backward_on_cpu_is_twice_the_forward_contractions():
    """On CPU, SDPA's backward is one fused kernel (_scaled_dot_product_flash_attention_for_cpu
    _backward, taken when E == Ev); batch 2, heads 3, L 5, S 7, E = Ev = 4: forward
    2*3*5*7*(4+4) = 1,680 MACs."""
    q = torch.randn(2, 3, 5, 4, requires_grad=True)
    k = torch.randn(2, 3, 7, 4, requires_grad=True)
    v = torch.randn(2, 3, 7, 4, requires_grad=True)

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    report = analyze(Attention(), (q, k, v), mode="train")
    assert report.forward.macs == 1_680
    assert report.backward.macs == 2 * 1_680
    fused = report.operators["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"]
    assert fused.backward_calls == 1 and fused.backward.macs == 3_360


# GPT-2 124M at (1, 1024), Karpathy's figures (nanoGPT transformer_sizing.ipynb), in FLOPs.
FORWARD_MATMUL = 212_678_148_096
KQV, SCORES, REDUCE, PROJ, MLP = (3_623_878_656, 1_610_612_736, 1_610_612_736,
                                  1_207_959_552, 9_663_676_416)
T, C = 1024, 768


@pytest.fixture(scope="module")
def gpt2_train():
    model, args = gpt2("meta", seq_len=T)
    return analyze(model, args, mode="train")


def test_gpt2_backward_matmul_is_twice_the_forward(gpt2_train):
    """Every contraction's input and weight need a gradient: the blocks' inputs come from the
    trained embeddings, so even the first layer computes grad_x. The exceptions are the
    embeddings: the token ids and positions are integers (no input gradient at all), and an
    embedding's weight gradient is an index-add, not a matmul (0 in both passes)."""
    assert gpt2_train.forward.matmul_flops == FORWARD_MATMUL
    assert gpt2_train.backward.matmul_flops == 2 * FORWARD_MATMUL
    for path in ("transformer.wte", "transformer.wpe"):
        embedding = gpt2_train.module(path)
        assert embedding.backward.matmul_flops == 0
        # One add per gradient element: T tokens x C channels scattered into the table.
        assert embedding.backward.flops == T * C
        assert set(embedding.operators) == {"aten.embedding.default",
                                            "aten.embedding_dense_backward.default"}


@pytest.mark.parametrize(("path", "forward"), [
    ("transformer.h.0.attn.c_attn", KQV), ("transformer.h.0.attn.c_proj", PROJ),
    ("transformer.h.0.attn", KQV + SCORES + REDUCE + PROJ), ("transformer.h.5.mlp", MLP),
])
def test_gpt2_component_backward_is_twice_its_forward(gpt2_train, path, forward):
    record = gpt2_train.module(path)
    assert (record.inclusive - record.backward).matmul_flops == forward
    assert record.backward.matmul_flops == 2 * forward


def test_backward_ops_are_charged_to_the_module_of_the_op_they_differentiate(gpt2_train):
    forward = {n.name: n for n in gpt2_train.nodes if n.phase == "forward"}
    backward = [n for n in gpt2_train.nodes if n.phase == "backward"]
    assert backward and gpt2_train.uncounted == []
    for node in backward:
        assert node.module == forward[node.differentiates].module


def test_freezing_a_block_drops_its_weight_gradients_only():
    """h.0 frozen: its linears still pass gradients to the trained embeddings (grad_x, 1x
    forward) and attention's core has no weights (2x forward):
    (KQV + PROJ + MLP) + 2 * (SCORES + REDUCE) = 20,937,965,568."""
    model, args = gpt2("meta", seq_len=T)
    model.transformer.h[0].requires_grad_(False)
    report = analyze(model, args, mode="train")
    assert (report.module("transformer.h.0").backward.matmul_flops
            == (KQV + PROJ + MLP) + 2 * (SCORES + REDUCE) == 20_937_965_568)
    assert report.module("transformer.h.1").backward.matmul_flops == 2 * (
        KQV + SCORES + REDUCE + PROJ + MLP)


def test_freezing_everything_below_a_block_removes_its_backward():
    """Embeddings and h.0 frozen: nothing h.0 computes depends on a trained tensor."""
    model, args = gpt2("meta", seq_len=T)
    model.transformer.wpe.requires_grad_(False)
    model.transformer.h[0].requires_grad_(False)
    model.transformer.wte.requires_grad_(False)  # tied: lm_head's weight is frozen too
    report = analyze(model, args, mode="train")
    assert report.module("transformer.h.0").backward.flops == 0
    assert report.module("transformer.wte").backward.flops == 0
    # lm_head: weight frozen, input from trained h.11: grad_x only, 1x its forward.
    assert report.module("lm_head").backward.matmul_flops == 2 * C * 50304


def test_symbolic_train_counts_evaluate_to_concrete_ones():
    model, args = gpt2("meta", seq_len=16, batch=2)
    dynamic = ({0: Dim("batch", max=8), 1: Dim("seq", max=1024)},)
    report = analyze(model, args, dynamic_shapes=dynamic, mode="train")
    for batch, seq in [(1, 64), (3, 200)]:
        concrete = analyze(*gpt2("meta", seq_len=seq, batch=batch), mode="train")
        evaluated = report.evaluate(batch=batch, seq=seq)
        assert evaluated.backward == concrete.backward
        assert evaluated.by_module() == concrete.by_module()


def test_an_op_without_a_backward_is_reported_not_skipped(uncounted):
    formulas = {uncounted.op: lambda call: call.cost(flops=call.out.numel)}
    report = analyze(uncounted.model(4), (torch.randn(2, 4),), mode="train", formulas=formulas)
    [missing] = report.uncounted
    assert missing.op == uncounted.name
    assert "backward not traced" in missing.reason
    with pytest.raises(UncountedOpError, match="doubled"):
        analyze(uncounted.model(4), (torch.randn(2, 4),), mode="train", strict=True,
                formulas=formulas)


def test_mode_must_be_forward_or_train():
    with pytest.raises(ValueError, match="mode must be 'forward' or 'train', got 'backward'"):
        analyze(nn.Linear(2, 2), (torch.randn(1, 2),), mode="backward")


def test_grouped_conv_weight_gradient_has_the_forward_macs():
    """Depthwise conv, 8 channels (groups=8), 3x3, batch 2 on 10x10 -> 8x8: forward
    2*8*8*8 positions x 1*3*3 weights = 9,216 MACs. The weight gradient sums, for each of the
    8*1*3*3 weights, over the 2*8*8 output positions: 9,216 MACs too; the input gradient is the
    transposed conv: 9,216. (torch.utils.flop_counter's conv_backward_flop ignores groups for
    the weight gradient and counts it 8x.)"""
    conv = nn.Conv2d(8, 8, 3, groups=8, bias=False)
    report = analyze(conv, (torch.randn(2, 8, 10, 10, requires_grad=True),), mode="train")
    assert report.forward.macs == 9_216
    assert report.backward.macs == 2 * 9_216


def test_flops_report_shows_the_train_totals():
    """Linear(4, 8), ReLU, Linear(8, 2) on 3 rows; the data needs no gradient.
    Forward: MACs 3*4*8 + 3*8*2 = 144 -> 288 FLOPs, biases 3*8 + 3*2 = 30, ReLU 24: 342.
    Backward: first linear grad_W only (96 MACs), second grad_x and grad_W (48 + 48): 192 MACs
    -> 384 FLOPs, bias gradients 24 + 6, ReLU gradient 24: 438. Ratio 438 / 342 = 1.281."""
    from exportflops.render import flops_report

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    report = analyze(model, (torch.randn(3, 4),), mode="train")
    summary = {line.split("  ")[0]: line for line in
               flops_report(report, view="summary").splitlines()}
    assert " 342 " in summary["forward FLOPs"] and "matmul 288" in summary["forward FLOPs"]
    assert " 438 " in summary["backward FLOPs"] and "matmul 384" in summary["backward FLOPs"]
    assert " 1.281 " in summary["backward / forward"]
    tree = flops_report(report, view="tree")
    first_linear = next(line for line in tree.splitlines() if line.startswith("  (0): Linear"))
    assert first_linear.split()[9:11] == ["216", "1.000"]  # 2*96 + 24 bias; grad_W only: 1x
