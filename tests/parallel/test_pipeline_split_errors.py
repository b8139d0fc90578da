"""Splits torch's pipelining cannot make are refused with a typed error naming the model, the
split points and the next step."""

from __future__ import annotations

import pytest
import torch

from exportflops.errors import ExportError, InputError
from exportflops.parallel.pipeline import analyze_pipeline


class Two(torch.nn.Module):
    """Two linears, a spare one never called, and (``branchy``) a branch on a value."""

    def __init__(self, branchy: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.spare = (torch.nn.Linear(4, 4) for _ in range(3))
        self.branchy = branchy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if self.branchy and x.sum() > 0:  # data-dependent: torch.export cannot trace it
            x = -x
        return self.b(x)


def test_a_split_point_that_is_no_module_is_named():
    with pytest.raises(InputError, match="Two has no module 'c'.*named_modules"):
        analyze_pipeline(Two(), (torch.randn(2, 4),), stages=["c"])


def test_a_split_point_never_called_is_refused():
    with pytest.raises(InputError, match="at spare gave 1 stages, not 2: a split point is never"):
        analyze_pipeline(Two(), (torch.randn(2, 4),), stages=["spare"])


def test_a_model_torchs_tracer_refuses_names_the_next_step():
    with pytest.raises(ExportError, match="(?s)Two.*stages=\\[...\\]"):
        analyze_pipeline(Two(branchy=True), (torch.randn(2, 4),), stages=["b"])


@pytest.mark.parametrize("stages", [0, -1, True, 2.5, "layers"], ids=repr)
def test_a_count_of_stages_below_one_or_no_count_at_all_is_refused(stages):
    with pytest.raises(InputError, match=f"stages={stages!r}"):
        analyze_pipeline(Two(), (torch.randn(2, 4),), stages=stages)


def test_a_sequential_splits_by_its_entries():
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(4)))
    record = analyze_pipeline(model, (torch.randn(2, 4),), stages=2, device=None).record
    assert [s.modules for s in record.stages] == [["0", "1"], ["2", "3"]]
