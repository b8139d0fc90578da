"""Convolutional nets against hand derivations and torchvision's published figures.

A convolution is (output positions) x (C_in / groups) x kh x kw MACs per output channel.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.examples.resnet import resnet50


def conv_macs(side_out: int, c_in: int, c_out: int, kernel: int, groups: int = 1) -> int:
    return side_out * side_out * c_out * (c_in // groups) * kernel * kernel


def resnet50_macs() -> int:
    """ResNet-50 v1.5 at 224x224, from the architecture: stem 7x7/2 to 112x112, max pool to 56;
    stages of [3, 4, 6, 3] bottlenecks (1x1 reduce, 3x3 with the stride, 1x1 expand x4) on
    56, 28, 14, 7; a 1x1/stride shortcut on each stage's first block; fc 2048 -> 1000."""
    macs = conv_macs(112, 3, 64, 7)
    inplanes, side_in = 64, 56
    for blocks, planes, side in [(3, 64, 56), (4, 128, 28), (6, 256, 14), (3, 512, 7)]:
        for block in range(blocks):
            c_in = inplanes if block == 0 else planes * 4
            side_before = side_in if block == 0 else side
            macs += conv_macs(side_before, c_in, planes, 1)  # reduce, before the stride
            macs += conv_macs(side, planes, planes, 3)
            macs += conv_macs(side, planes, planes * 4, 1)
            if block == 0:
                macs += conv_macs(side, c_in, planes * 4, 1)  # the shortcut
        inplanes, side_in = planes * 4, side
    return macs + 2048 * 1000


def test_resnet50_macs_and_params_equal_the_derivation_and_torchvision():
    """torchvision's model card: ResNet50_Weights.IMAGENET1K_V1, 25,557,032 params and
    4.09 GFLOPS (its `_ops`, which counts MACs)."""
    report = analyze(*resnet50())
    assert report.total.macs == resnet50_macs() == 4_089_184_256
    assert round(report.total.macs / 1e9, 2) == 4.09
    assert report.params == 25_557_032
    assert report.uncounted == []


class GroupedBottleneck(nn.Module):
    """ResNeXt-style: 1x1 64 -> 32, 3x3 grouped (8 groups), a depthwise 3x3, 1x1 32 -> 64, on
    (2, 64, 8, 8) with padding 1 throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(64, 32, 1, bias=False)
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=8, bias=False)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
        self.expand = nn.Conv2d(32, 64, 1, bias=False)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x):
        y = self.depthwise(torch.relu(self.grouped(torch.relu(self.reduce(x)))))
        return torch.relu(self.bn(self.expand(y)) + x)


@pytest.mark.parametrize(("path", "macs"), [
    ("reduce", 2 * conv_macs(8, 64, 32, 1)),  # 2 * 8*8*32*64 = 262,144
    ("grouped", 2 * conv_macs(8, 32, 32, 3, groups=8)),  # 2 * 8*8*32*4*9 = 147,456
    ("depthwise", 2 * conv_macs(8, 32, 32, 3, groups=32)),  # 2 * 8*8*32*1*9 = 36,864
    ("expand", 2 * conv_macs(8, 32, 64, 1)),  # 262,144
])
def test_grouped_and_depthwise_convolutions(path, macs):
    report = analyze(GroupedBottleneck().eval(), (torch.randn(2, 64, 8, 8),))
    assert report.module(path).inclusive.macs == macs
    assert report.uncounted == []
