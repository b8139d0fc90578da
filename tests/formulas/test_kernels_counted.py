"""Kernels that had no formula, each counted by hand: fractional max pooling, the backward of
pdist and of the margin losses, and the quantized and attention kernels torch calls directly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportflops import analyze
from exportflops.errors import FormulaError
from exportflops.formulas import FORMULAS, OpCall, TensorMeta
from tests.models import Call

aten = torch.ops.aten


class Trained(nn.Module):
    """A weight before ``function``, so that its input needs a gradient."""

    def __init__(self, function, width):
        super().__init__()
        self.function = function
        self.weight = nn.Parameter(torch.randn(width, width))

    def forward(self, x, *rest):
        return self.function(x @ self.weight, *rest).sum()


def _backward_flops(function, x, *rest, op: str) -> int:
    report = analyze(Trained(function, x.shape[-1]), (x, *rest), mode="train")
    assert report.uncounted == []
    return sum(node.cost.flops for node in report.nodes
               if node.phase == "backward" and node.op.startswith(f"aten.{op}."))


def test_fractional_max_pool_compares_and_draws_its_windows():
    """2 x 3 planes of 10 x 10 to 4 x 4, kernel 3: 96 outputs of 8 compares, 768. Window starts
    per plane and dim: alpha once and 3 FLOPs for each of 3 starts, 10; 2 dims x 6 planes: 120.
    888 in all. 3-D, 1 x 2 planes of 6^3 to 3^3, kernel 2: 54 outputs x 7 = 378, starts 3 dims
    x (3 * 2 + 1) x 2 planes = 42: 420. Backward: each of the 96 gradients added where its max
    was."""
    planar = analyze(Call(lambda x: F.fractional_max_pool2d(x, 3, output_size=(4, 4))),
                     (torch.randn(2, 3, 10, 10),))
    volumetric = analyze(Call(lambda x: F.fractional_max_pool3d(x, 2, output_size=(3, 3, 3))),
                         (torch.randn(1, 2, 6, 6, 6),))
    assert (planar.total.flops, volumetric.total.flops) == (888, 420)
    assert _backward_flops(lambda x: F.fractional_max_pool2d(x, 3, output_size=(4, 4)),
                           torch.randn(2, 3, 10, 10), op="fractional_max_pool2d_backward") == 96


@pytest.mark.parametrize("p, derivative", [(2.0, 2), (1.0, 2), (3.0, 6)])
def test_pdist_backward(p, derivative):
    """5 rows of 10: 10 pairs x 10 features, each the difference, the p-norm's derivative (ATen's
    Distance kernels: p = 2 ``grad * diff / dist`` 2, p = 1 ``grad * sign(diff)`` 2, p = 3
    ``diff * |diff|^(p-2) * grad / dist^(p-1)`` 6), and the add and subtract into the pair's
    rows: 100 x (3 + derivative)."""
    flops = _backward_flops(lambda x: F.pdist(x, p=p), torch.randn(5, 10), op="_pdist_backward")
    assert flops == 100 * (3 + derivative)


def test_margin_losses_backward():
    """3 samples of 10 classes, 30 elements. multi_margin, p = 1: the margin (2), accumulated
    (1), scaled by the output's gradient (1): 4 each, 120; p = 2 with a weight: + 2 for 2 g z
    and 1 for the weight, 7 each, 210. multilabel_margin: 10 target slots x 10 classes per
    sample, 4 each, plus the scaling per element: 30 x 41 = 1,230."""
    x, target = torch.randn(3, 10), torch.tensor([1, 2, 0])
    labels = torch.tensor([[1, -1] + [0] * 8] * 3)
    plain = _backward_flops(F.multi_margin_loss, x, target, op="multi_margin_loss_backward")
    weighted = _backward_flops(lambda x, t: F.multi_margin_loss(x, t, p=2, weight=torch.ones(10)),
                               x, target, op="multi_margin_loss_backward")
    multilabel = _backward_flops(F.multilabel_margin_loss, x, labels,
                                 op="multilabel_margin_loss_backward")
    assert (plain, weighted, multilabel) == (120, 210, 1_230)


def test_dynamically_quantized_int4_matmul():
    """8 x 64 activations, 48 outputs: 8 * 48 * 64 = 24,576 MACs; quantizing the activations
    2 * 8 * 64 = 1,024, the weights' scales 48 * 64 = 3,072: 49,152 + 4,096 = 53,248 FLOPs."""
    report = analyze(Call(lambda x, w: aten._dyn_quant_matmul_4bit(x, w, 32, 64, 48)),
                     (torch.randn(8, 64), torch.empty(2000, dtype=torch.uint8)))
    assert (report.total.macs, report.total.flops) == (24_576, 53_248)


def _formula(op, args: dict, out: TensorMeta):
    return FORMULAS.lookup(op).formula(OpCall(op, args, (out,)))


def test_mixed_dtypes_linear():
    """CUDA only, so counted from its call: 16 x 64 half activations, 32 outputs: 32,768 MACs;
    dequantizing 64 x 32 weights 2,048; bias and relu 2 x 512. 65,536 + 2,048 + 1,024."""
    half = torch.float16
    args = {"input": TensorMeta((16, 64), half), "weight": TensorMeta((64, 32), torch.int8),
            "scale": TensorMeta((32,), half), "bias": TensorMeta((32,), half),
            "activation": "relu"}
    cost = _formula(aten._mixed_dtypes_linear.default, args, TensorMeta((16, 32), half))
    assert (cost.macs, cost.flops) == (32_768, 68_608)


def test_cudnn_attention_forward_dense_and_packed():
    """Batch 2, 4 heads, 16 x 16 pairs, q.k and p.v over 32 each: 8 * 256 * 64 = 131,072
    MACs. Packed sequences (their lengths in cum_seq's values) are refused, which reports the
    node uncounted."""
    q = TensorMeta((2, 4, 16, 32), torch.float16)
    args = {"query": q, "key": q, "value": q, "attn_bias": None, "cum_seq_q": None,
            "cum_seq_k": None, "max_q": 16, "max_k": 16, "compute_log_sumexp": False,
            "dropout_p": 0.0, "is_causal": False}
    op = aten._cudnn_attention_forward.default
    assert _formula(op, args, q).macs == 131_072
    packed = dict(args, cum_seq_q=TensorMeta((3,), torch.int32))
    with pytest.raises(FormulaError, match="variable-length"):
        _formula(op, packed, q)


@pytest.mark.parametrize("special", [torch.special.i0, torch.special.i1e, torch.special.erfcx,
                                     torch.special.ndtri, torch.special.bessel_j0,
                                     torch.special.bessel_y1, torch.special.modified_bessel_k0,
                                     torch.special.airy_ai, lambda x: torch.special.zeta(x, x)])
def test_special_functions_are_one_flop_per_element(special):
    """The pointwise convention (a transcendental function is 1 FLOP per output element): 4 x 8
    = 32, whether torch lowers the op to a prim (i0, erfcx, zeta) or runs its own kernel."""
    report = analyze(Call(special), (torch.rand(4, 8) + 1,))
    assert report.uncounted == [] and report.total.flops == 32


def test_special_polynomials_say_their_work_depends_on_the_values():
    """torch evaluates T_n(x) by a recurrence of up to n steps or by cos(n acos x), per element
    as x decides: no count from shapes."""
    report = analyze(Call(lambda x: torch.special.chebyshev_polynomial_t(x, 7)),
                     (torch.rand(4, 8),))
    (uncounted,) = report.uncounted
    assert "recurrence" in uncounted.reason


def test_mode_sorts_each_slice():
    """4 x 8, mode along the last dim: each row sorted (ceil(log2 8) = 3 compares per element)
    and scanned for its longest run (1): 32 x 4 = 128."""
    report = analyze(Call(lambda x: torch.mode(x)[0]), (torch.randn(4, 8),))
    assert report.uncounted == [] and report.total.flops == 128


def test_packing_padded_sequences_moves_data():
    """pack_padded_sequence copies the rows the lengths keep: no arithmetic, but counted."""
    pack = torch.nn.utils.rnn.pack_padded_sequence
    report = analyze(Call(lambda x: pack(x, torch.tensor([3, 2]), batch_first=True).data),
                     (torch.randn(2, 3, 4),))
    assert report.uncounted == [] and report.total.flops == 0


def test_an_embeddings_max_norm_says_its_work_depends_on_the_values():
    """max_norm rescales only the selected rows whose norm exceeds it: the values decide."""
    table = nn.Embedding(10, 4, max_norm=1.0)
    report = analyze(table, (torch.tensor([[1, 2, 2]]),))
    (uncounted,) = report.uncounted
    assert "max_norm" in uncounted.reason and uncounted.op.startswith("aten.embedding_renorm_")


def test_resize_as_is_data_movement():
    """CrossMapLRN2d resizes its scale buffer to its input's shape (resize_as_): no arithmetic,
    declared so rather than left uncounted."""
    report = analyze(nn.CrossMapLRN2d(3), (torch.randn(2, 4, 5, 5),))
    assert report.uncounted == []
    assert any(node.op.startswith("aten.resize_as") and node.status == "zero"
               for node in report.nodes)


@pytest.mark.parametrize("options, flops", [
    ({}, 27 * (3 * 3 + 25) + 54 * 15), ({"padding_mode": "border"}, 27 * (3 * 4 + 25) + 54 * 15),
    ({"padding_mode": "reflection"}, 27 * (3 * 11 + 25) + 54 * 15),
    ({"mode": "nearest"}, 27 * 3 * (3 + 1)),
])
def test_grid_sample_on_volumes(options, flops):
    """2 channels of 4^3 sampled at 3^3 points: 27 points, 54 outputs. Per point, 3 coordinates
    unnormalized (3 each) and padded (border's clip 1, reflection's reflect and clip 8), then the
    trilinear weights (3 floors, 6 distances, 8 products of 3: 25) or nearest's round per
    coordinate; per output, 8 corners blended (8 multiplies, 7 adds) or one copied."""
    report = analyze(Call(lambda x, g: F.grid_sample(x, g, align_corners=False, **options)),
                     (torch.randn(1, 2, 4, 4, 4), torch.rand(1, 3, 3, 3, 3) * 2 - 1))
    assert report.uncounted == [] and report.total.flops == flops


def test_sampling_and_segments():
    """4 rows of 8 weights. multinomial with replacement, 5 samples: cumulative sums and their
    normalization (16) and a binary search of 3 compares per sample (15): 4 x 31 = 124; without
    replacement, each weight divided by a draw and the top 3 selected: 4 x 16 = 64.
    segment_reduce of 6 x 3 into segments of 2 and 4 rows: 18 adds; 'mean' also divides the
    2 x 3 outputs: 24."""
    weights, data, lengths = torch.rand(4, 8) + 0.1, torch.randn(6, 3), torch.tensor([2, 4])
    counts = [analyze(Call(function), inputs).total.flops for function, inputs in (
        (lambda p: torch.multinomial(p, 5, replacement=True), (weights,)),
        (lambda p: torch.multinomial(p, 3), (weights,)),
        (lambda d, n: torch.segment_reduce(d, "sum", lengths=n), (data, lengths)),
        (lambda d, n: torch.segment_reduce(d, "mean", lengths=n), (data, lengths)))]
    assert counts == [124, 64, 18, 24]


def test_logit_backward_and_the_other_pointwise_kernels():
    """logit's gradient: 2 compares against eps and grad / (x (1 - x)), 5 per element: 160 on
    4 x 8 (the forward's logit and sum, 32 each, on top). angle and training rrelu's noisy
    slope: 1 per element."""
    x = torch.rand(4, 8)
    train = analyze(Call(lambda x: torch.logit(x, eps=1e-6).sum()), (x.requires_grad_(),),
                    mode="train")
    angle = analyze(Call(torch.angle), (torch.randn(4, 8),))
    noisy = analyze(Call(lambda x: F.rrelu(x, training=True)), (torch.randn(4, 8),))
    assert (train.total.flops, angle.total.flops, noisy.total.flops) == (64 + 160, 32, 32)


def test_lanczos_resize_blends_every_pixel_under_its_filter():
    """8 x 8 to 4 x 4: scale 2, Lanczos-3's 6 taps widen to support 6. Output i's window is
    [int(2 (i + 0.5) - 6 + 0.5), int(2 (i + 0.5) + 6 + 0.5)) clipped to [0, 8): 7, 8, 8, 7
    pixels, 30 per dim, 900 weights; each output's k taps are k multiplies and k - 1 adds:
    2 x 900 - 16 = 1,784."""
    resize = Call(lambda x: torch.ops.aten._upsample_lanczos2d_aa(x, [4, 4], False))
    report = analyze(resize, (torch.randn(1, 1, 8, 8),))
    assert report.uncounted == [] and report.total.flops == 1_784


def test_more_backward_kernels():
    """embedding_bag's per-sample weights' gradient: each of 6 indices' row (width 4) dotted
    with its bag's gradient, 24 MACs. segment_reduce's: one FLOP per element of its 6 x 3
    data, 18. _add_relu (the mobile optimizer's fusion): an add and a relu, 2 per element."""

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.table, self.scales = nn.Parameter(torch.randn(10, 4)), nn.Parameter(torch.ones(6))

        def forward(self, indices, offsets):
            return F.embedding_bag(indices, self.table, offsets,
                                   mode="sum", per_sample_weights=self.scales).sum()

    bag = analyze(Bag(), (torch.arange(1, 7), torch.tensor([0, 3])), mode="train")
    segments = analyze(Call(lambda d, n: torch.segment_reduce(d, "sum", lengths=n).sum()),
                       (torch.randn(6, 3, requires_grad=True), torch.tensor([2, 4])),
                       mode="train")
    fused = analyze(Call(torch.ops.aten._add_relu), (torch.randn(4, 8), torch.randn(4, 8)))
    (weights_grad,) = [n for n in bag.nodes
                       if n.op == "aten._embedding_bag_per_sample_weights_backward.default"]
    (segment_grad,) = [n for n in segments.nodes
                       if n.op == "aten._segment_reduce_backward.default"]
    assert (weights_grad.cost.macs, segment_grad.cost.flops, fused.total.flops) == (24, 18, 64)
