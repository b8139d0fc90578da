"""A binary search (``searchsorted``, ``bucketize``: MusicFlamingo's rotary time buckets, met
by the ``hf:`` sweep) counts ceil(log2(n + 1)) compares per value searched over n sorted
boundaries: each compare halves the n + 1 slots a value can fall in."""

from __future__ import annotations

import torch

from exportflops import analyze


class Search(torch.nn.Module):
    def forward(self, boundaries, values):
        return torch.searchsorted(boundaries, values)


class Buckets(torch.nn.Module):
    def forward(self, values, boundaries):
        return torch.bucketize(values, boundaries)


def test_searchsorted_counts_a_binary_search_per_value():
    # 4 x 10 values over 16 boundaries: 17 slots, ceil(log2 17) = 5 compares each.
    report = analyze(Search(), (torch.arange(16.0), torch.zeros(4, 10)))
    assert report.uncounted == []
    assert report.total.flops == 4 * 10 * 5


def test_bucketize_counts_the_same_search():
    # 7 values over 8 boundaries: 9 slots, ceil(log2 9) = 4 compares each.
    report = analyze(Buckets(), (torch.zeros(7), torch.arange(8.0)))
    assert report.uncounted == []
    assert report.total.flops == 7 * 4
