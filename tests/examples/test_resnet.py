"""The built-in ResNet-50 against torchvision's published figures and a per-stage hand derivation.

Published (torchvision `ResNet50_Weights.IMAGENET1K_V1.meta`, pytorch/vision
``torchvision/models/resnet.py``, and the docs' table of classification weights): 25,557,032
parameters and ``_ops`` 4.089 "GFLOPS" at 224x224, which torchvision counts as conv + linear
multiply-accumulates (its ``_ops`` are MACs; docs/conventions.md, Units).

Hand derivation at 224x224, one image (MACs of a conv = output elements x in-channels x k x k):
  1. stem conv1 7x7/2, 3->64, out 112x112: 64*112*112 * 3*7*7 = 118,013,952.
  2. A bottleneck of width w, in-channels c_in, output side s (ResNet v1.5: the 3x3 conv
     strides, so conv1 runs at the input side s_in):
       conv1 1x1 c_in->w at s_in^2, conv2 3x3 w->w at s^2, conv3 1x1 w->4w at s^2,
       downsample (first block of a stage) 1x1 c_in->4w at s^2.
  3. Stages (blocks, w, s_in of the first block, s): layer1 (3, 64, 56, 56),
     layer2 (4, 128, 56, 28), layer3 (6, 256, 28, 14), layer4 (3, 512, 14, 7).
     E.g. layer1 block 0: 56*56 * (64*64 + 9*64*64 + 64*256 + 64*256) = 231,211,008;
     blocks 1-2: 56*56 * (256*64 + 9*64*64 + 64*256) = 218,365,952 each; layer1 667,942,912.
     Every later block (after a stage's first) costs 218,365,952 too: the side halves as the
     width doubles.
  4. fc 2048->1000: 2,048,000.
"""

from __future__ import annotations

import pytest

from exportflops import analyze, flops_report
from exportflops.examples import EXAMPLES
from exportflops.examples.resnet import resnet50

PUBLISHED_PARAMS = 25_557_032  # torchvision ResNet50_Weights.IMAGENET1K_V1 num_params
PUBLISHED_GMACS = 4.089  # torchvision ResNet50_Weights.IMAGENET1K_V1 _ops ("GFLOPS" = MACs)

# (stage, blocks, width, input side of the first block, output side)
STAGES = [("layer1", 3, 64, 56, 56), ("layer2", 4, 128, 56, 28),
          ("layer3", 6, 256, 28, 14), ("layer4", 3, 512, 14, 7)]


def bottleneck_macs(c_in: int, width: int, side_in: int, side: int, downsample: bool) -> int:
    macs = (side_in ** 2 * c_in * width           # conv1 1x1
            + side ** 2 * width * width * 9        # conv2 3x3, strided
            + side ** 2 * width * 4 * width)       # conv3 1x1, expansion 4
    return macs + (side ** 2 * c_in * 4 * width if downsample else 0)


def stage_macs(blocks: int, width: int, side_in: int, side: int) -> int:
    c_in = 64 if width == 64 else 2 * width  # layer1 takes the stem's 64; later stages 4 * w/2
    first = bottleneck_macs(c_in, width, side_in, side, downsample=True)
    return first + (blocks - 1) * bottleneck_macs(4 * width, width, side, side, downsample=False)


def bottleneck_params(c_in: int, width: int, downsample: bool) -> int:
    convs = c_in * width + 9 * width * width + width * 4 * width
    batch_norms = 2 * (width + width + 4 * width)  # weight and bias per channel
    return convs + batch_norms + ((c_in * 4 * width + 2 * 4 * width) if downsample else 0)


STEM_MACS = 64 * 112 * 112 * 3 * 7 * 7
FC_MACS = 2048 * 1000
HAND_STAGE_MACS = {name: stage_macs(blocks, width, side_in, side)
                   for name, blocks, width, side_in, side in STAGES}


@pytest.fixture(scope="module")
def report():
    return analyze(*resnet50())


def test_stage_derivation_reproduces_the_worked_example():
    assert bottleneck_macs(64, 64, 56, 56, downsample=True) == 231_211_008
    assert HAND_STAGE_MACS["layer1"] == 667_942_912


def test_each_stage_has_its_hand_derived_macs(report):
    assert report.module("conv1").inclusive.macs == STEM_MACS == 118_013_952
    assert {name: report.module(name).inclusive.macs for name in HAND_STAGE_MACS} == \
        HAND_STAGE_MACS
    assert report.module("fc").inclusive.macs == FC_MACS


def test_total_macs_are_torchvisions_published_4_09_g(report):
    hand = STEM_MACS + sum(HAND_STAGE_MACS.values()) + FC_MACS
    assert report.total.macs == hand == 4_089_184_256
    assert round(report.total.macs / 1e9, 3) == PUBLISHED_GMACS


def test_parameters_are_torchvisions_published_count(report):
    stem = 3 * 64 * 7 * 7 + 2 * 64
    stages = sum(bottleneck_params(64 if w == 64 else 2 * w, w, True)
                 + (blocks - 1) * bottleneck_params(4 * w, w, False)
                 for _, blocks, w, _, _ in STAGES)
    fc = 2048 * 1000 + 1000
    assert report.params == stem + stages + fc == PUBLISHED_PARAMS


def test_macs_scale_with_batch_and_image_area():
    """Convolutions are linear in the output area: 2 images at 448x448 are 8x the convs of one
    at 224x224 (the classifier sees one 2048-vector per image whatever the size: 2x fc)."""
    big = analyze(*resnet50(batch=2, image_size=448))
    assert big.total.macs == 8 * (4_089_184_256 - FC_MACS) + 2 * FC_MACS


def test_is_a_built_in_example_and_its_tree_collapses_identical_blocks(report):
    assert EXAMPLES["resnet50"] is resnet50
    tree = flops_report(report, view="tree", depth=2)
    # Blocks after a stage's first are identical; the first has the downsample.
    for run in ("(1)..(2): Bottleneck x 2", "(1)..(3): Bottleneck x 3",
                "(1)..(5): Bottleneck x 5"):
        assert run in tree
