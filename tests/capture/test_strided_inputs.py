"""An example input that is not contiguous (a slice of a dataset, a transpose) makes torch.export
fail in words about sizes ("guard size()[1] != 33") or strides; the hint says it is that
input's strides and to pass it ``.contiguous()``, and it says nothing of strides where the
failure is not theirs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

import exportflops
from exportflops.errors import ExportError


class Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(self.embed(x))


class Halved(nn.Module):
    """Views its input as half as many rows of twice the width."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(66, 4)

    def forward(self, x):
        return self.proj(x.view(x.shape[0] // 2, -1))


def test_a_slice_of_a_dataset_with_a_dynamic_length_is_told_its_strides():
    # Rows of 33 tokens cut to 20: strides (33, 1), contiguous only where the length is 33, so
    # export guards the dynamic length against it.
    dataset = torch.randint(0, 100, (4, 33))
    x = dataset[:, :20]
    shapes = ({1: Dim("seq", max=64)},)
    with pytest.raises(ExportError) as failed:
        exportflops.analyze(Embedded(), (x,), dynamic_shapes=shapes)
    assert "L['x'].size()[1] != 33" in failed.value.torch_message
    assert failed.value.hint.startswith("args[0] (x) is not contiguous: its strides (33, 1) "
                                        "(shape [4, 20])")
    assert "Pass args[0].contiguous()" in failed.value.hint
    # The step the hint names works: the projection is 4 x seq x 16 x 16 MACs, at seq = 20.
    report = exportflops.analyze(Embedded(), (x.contiguous(),), dynamic_shapes=shapes)
    assert report.evaluate(seq=20).total.macs == 4 * 20 * 16 * 16


@pytest.mark.parametrize("view", ["columns", "transpose"])
def test_a_view_its_strides_forbid_is_told_its_strides(view):
    x = torch.randn(8, 66)[:, :33] if view == "columns" else torch.randn(33, 8).t()
    strides = "(66, 1)" if view == "columns" else "(1, 8)"
    with pytest.raises(ExportError) as failed:
        exportflops.analyze(Halved(), (x,))
    assert f"strides {strides}" in failed.value.torch_message
    assert failed.value.hint.startswith(f"args[0] (x) is not contiguous: its strides {strides}")


def test_a_failure_that_is_not_the_strides_gets_no_strides_hint():
    # Every other column, strides (66, 2): the view into 4 rows of 66 is allowed, and what
    # fails is the dynamic rows, which a contiguous input fails alike (rows // 2 for odd rows).
    x = torch.randn(8, 66)[:, ::2]
    for given in (x, x.contiguous()):
        with pytest.raises(ExportError) as failed:
            exportflops.analyze(Halved(), (given,), dynamic_shapes=({0: Dim("rows", max=64)},))
        assert "strides" not in failed.value.hint
