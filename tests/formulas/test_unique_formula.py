"""Unique values (``unique_consecutive``: Qwen2.5-VL's window index, met by the ``hf:`` sweep;
``unique`` and ``unique(dim=)``): one compare per element with its neighbour, after a sort of
ceil(log2 L) compares per element where the values are sorted first."""

from __future__ import annotations

import torch

from exportflops import analyze


class Consecutive(torch.nn.Module):
    def forward(self, x):
        return torch.unique_consecutive(x, return_counts=True)


class Unique(torch.nn.Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.unique(x, sorted=True, dim=self.dim)


def _flops(model, x) -> int:
    # The outputs' lengths depend on the values (bytes written are in u0); the compares not.
    report = analyze(model, (x,))
    assert report.uncounted == []
    return report.total.flops


def test_unique_consecutive_compares_each_element_once():
    # 3 x 8 values: 24 compares.
    assert _flops(Consecutive(), torch.tensor([[1, 1, 2, 2, 2, 3, 3, 1]] * 3)) == 24


def test_unique_sorts_then_compares():
    # 20 values: ceil(log2 20) = 5 compares each to sort, 1 with the neighbour: 20 x 6.
    assert _flops(Unique(), torch.arange(20) % 7) == 20 * 6


def test_unique_along_a_dim_sorts_its_slices():
    # 6 rows of 4 along dim 0: ceil(log2 6) = 3 compares per element, +1: 24 x 4.
    assert _flops(Unique(dim=0), torch.arange(24).reshape(6, 4) % 3) == 24 * 4
