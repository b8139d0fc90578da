"""Train mode on the layers whose backward kernels have formulas of their own (resizes, pads,
adaptive max pools, shrinks, cdist, embedding bags, the grid sampler), and on ops whose sizes
are read from values (masked_select). Each expected count is derived in the test from what the
kernel does (ATen's, as the formula's comment cites), not read off the tool."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportflops import analyze


class Applies(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def backward_flops(fn, *args) -> int:
    """The backward's FLOPs of ``fn`` on ``args``, every backward op counted."""
    report = analyze(Applies(fn), args, mode="train")
    backward = [n for n in report.nodes if n.phase == "backward"]
    assert [n.op for n in backward if n.status in ("uncounted", "error")] == []
    return sum(n.cost.flops for n in backward)


def image(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


# A 2x resize of (1, 2, 4, 4) has 1 x 2 x 8 x 8 = 128 output gradient elements.
@pytest.mark.parametrize("mode, per_element", [
    ("nearest", 1),  # each added into the pixel it repeats
    ("nearest-exact", 1),
    ("bilinear", 2 * 4),  # times each of its 4 neighbours' weights, added into them
    ("bicubic", 2 * 16),  # 16 neighbours
])
def test_a_resize_backward_adds_each_gradient_into_the_pixels_it_blended(mode, per_element):
    def resize(x):
        return F.interpolate(x, scale_factor=2, mode=mode)

    assert backward_flops(resize, image(1, 2, 4, 4)) == 128 * per_element


def test_a_linear_and_a_trilinear_resize_backward_blend_2_and_8_neighbours():
    def linear(x):
        return F.interpolate(x, scale_factor=2, mode="linear")

    def trilinear(x):
        return F.interpolate(x, scale_factor=2, mode="trilinear")

    assert backward_flops(linear, image(1, 2, 4)) == 2 * 8 * 2 * 2  # 16 outputs
    assert backward_flops(trilinear, image(1, 1, 2, 2, 2)) == 64 * 2 * 8  # 64 outputs


def test_an_antialiased_resize_backward_applies_the_forwards_weights_again():
    def shrink(x):
        return F.interpolate(x, size=(4, 4), mode="bilinear", antialias=True)

    # From 8 to 4 the bilinear filter's support widens to 2: output i's window spans inputs
    # [int(2(i + 0.5) - 1.5), int(2(i + 0.5) + 2.5)) clipped to [0, 8): 3, 4, 4, 3 = 14 a dim.
    # Per channel 14 x 14 weights, each a multiply and an add into the input gradient.
    assert backward_flops(shrink, image(1, 3, 8, 8)) == 3 * 14 * 14 * 2


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_a_pad_backward_adds_each_gradient_element_where_it_was_copied_from(mode):
    def pad(x):
        return F.pad(x, (1, 1, 1, 1), mode=mode)

    assert backward_flops(pad, image(1, 2, 4, 4)) == 1 * 2 * 6 * 6


def test_an_adaptive_max_pool_backward_adds_each_gradient_at_its_max():
    def pool(x):
        return F.adaptive_max_pool2d(x, 3)

    assert backward_flops(pool, image(1, 2, 6, 6)) == 2 * 3 * 3


@pytest.mark.parametrize("shrink", [F.softshrink, F.hardshrink])
def test_a_shrink_backward_selects_the_gradient(shrink):
    assert backward_flops(shrink, image(2, 3)) == 6


@pytest.mark.parametrize("p, derivative", [
    (2.0, 2),  # ATen's tdist_calc::backward: grad * diff / dist
    (1.0, 2),  # odist_calc: grad * sign(diff)
    (3.0, 6),  # pdist_calc: diff * |diff|^(p - 2) * grad / dist^(p - 1)
    (0.0, None),  # no gradient: ATen fills it with zeros
])
def test_cdist_backward_is_called_for_each_input_with_its_norms_derivative(p, derivative):
    # x1 (1, 3, 4) to x2 (1, 5, 4): 15 pairs of 4 features. Each input's gradient: per pair and
    # feature the difference, the norm's derivative and the add into the row.
    def distances(x1, x2):
        return torch.cdist(x1, x2, p=p)

    per_element = 0 if derivative is None else 1 + derivative + 1
    assert backward_flops(distances, image(1, 3, 4), image(1, 5, 4)) == 2 * 15 * 4 * per_element


@pytest.mark.parametrize("mode, flops", [
    ("sum", 6 * 3),  # 6 indices, rows of 3: each bag's gradient row added into each
    ("mean", 6 * 3 * 2),  # divided by the bag's size first
    ("max", 2 * 3),  # 2 bags of 3 columns: each added into the row its max came from
])
def test_an_embedding_bag_backward_adds_each_bags_gradient_into_its_rows(mode, flops):
    def bags(weight):
        return F.embedding_bag(torch.tensor([[0, 1, 5], [2, 2, 7]]), weight, mode=mode)

    assert backward_flops(bags, image(10, 3)) == flops


@pytest.mark.parametrize("grid_grad", [False, True])
def test_the_grid_sampler_backward_always_computes_the_grids_gradient(grid_grad):
    def sample(x, grid):
        return F.grid_sample(x, grid, mode="bilinear", align_corners=False)

    grid = (torch.rand(1, 3, 3, 2) * 2 - 1).requires_grad_(grid_grad)
    # (1, 2, 3, 3): 18 sampled elements. Per element, 4 corners: the gradient times the
    # corner's weight added into it (2 each); and, whether the grid needs it or not (ATen
    # reads output_mask[0] only), per corner and coordinate value x distance x gradient (3).
    assert backward_flops(sample, image(1, 2, 4, 4), grid) == 18 * (4 * 2 + 4 * 2 * 3)


class SelectsTwice(nn.Module):
    """Two masked_selects of one tensor, each sized by its own mask's values: their backward
    ops must each read their own count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_select(x > 0).sum() + 2 * x.masked_select(x > 1).sum()


def test_a_size_read_from_values_is_the_same_size_in_the_backward():
    x = torch.tensor([[-1.0, 0.5, 2.0], [3.0, -2.0, 1.5]], requires_grad=True)
    report = analyze(SelectsTwice(), (x,), mode="train")
    # 4 elements above 0, 3 above 1; each masked_scatter of the backward reads its own count.
    scattered = [n.inputs[-1].shape for n in report.nodes
                 if n.op == "aten.masked_scatter.default"]
    assert sorted(scattered) == [[3], [4]]
    assert report.symbols == []
    # Forward: two compares (6 each), two sums (4 and 3), a multiply and an add of scalars.
    assert report.forward.flops == 6 + 6 + 4 + 3 + 1 + 1


class ScattersFeatures(nn.Module):
    """A multimodal model's merge: image features scattered into the text embeddings at the
    image tokens (LLaVA's ``masked_scatter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(4, 4)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        at_images = torch.tensor([0, 1, 1, 0]).bool()[None, :, None].expand_as(embeds)
        return embeds.masked_scatter(at_images, self.project(features))


def test_a_masked_scatters_backward_gathers_its_sources_gradient_with_no_arithmetic():
    report = analyze(ScattersFeatures(), (torch.randn(1, 4, 4), torch.randn(2, 4)),
                     mode="train")
    gathers = [n for n in report.nodes if n.op == "aten.masked_scatter_backward.default"]
    assert [(n.status, n.cost.flops) for n in gathers] == [("zero", 0)]
    assert report.uncounted == []


class IndicesOnCpu(nn.Module):
    """An embedding looked up by indices the forward makes with ``torch.arange`` on cpu (LongT5's
    relative positions): built on meta, its weight is on meta and its indices on cpu."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Embedding(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias(torch.arange(16) % 32)


def test_the_backward_of_an_op_mixing_meta_weights_and_cpu_indices_is_traced():
    report = analyze(IndicesOnCpu().to("meta"), (torch.randn(16, 8, device="meta"),),
                     mode="train")
    assert report.uncounted == []
    # The embedding's gradient adds each of the 16 x 8 gradient elements into its row.
    [gradient] = [n for n in report.nodes if n.op == "aten.embedding_dense_backward.default"]
    assert gradient.cost.flops == 16 * 8


def test_digammas_backward_is_the_trigamma_times_the_gradient():
    # grad * polygamma(1, x): a transcendental and a multiply per element.
    assert backward_flops(torch.digamma, image(2, 3)) == 2 * 6


def test_a_weight_norms_backward_differentiates_gain_and_direction():
    # wav2vec2's positional convolution: the weight v (6, 4, 3) normalized over dim 2's slices,
    # 3 norms. Per element of v: grad_w v summed (2) and grad_v's multiply, subtract and
    # multiply (3); per norm grad_g's divide, a = g / |v| and b = a grad_g / |v| (4).
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=2)
    report = analyze(conv, (torch.randn(1, 4, 10),), mode="train")
    [backward] = [n for n in report.nodes
                  if n.op == "aten._weight_norm_interface_backward.default"]
    assert backward.cost.flops == 5 * 72 + 4 * 3
