"""Grouped and depthwise convolutions against hand derivations (ResNet-50: test_resnet.py).

A convolution is (output positions) x (C_in / groups) x kh x kw MACs per output channel.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import analyze


def conv_macs(side_out: int, c_in: int, c_out: int, kernel: int, groups: int = 1) -> int:
    return side_out * side_out * c_out * (c_in // groups) * kernel * kernel


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
