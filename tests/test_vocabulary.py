"""The names fvcore's and DeepSpeed's users know, over one implementation: the Report queries,
`FlopCountAnalysis` and `get_model_profile`. Counts derived by hand for TwoLayerMLP on (2, 32):
fc1 Linear(32, 64) is 2*32*64 = 4,096 MACs, fc2 Linear(64, 10) is 2*64*10 = 1,280 MACs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import exportflops
from exportflops import FlopCountAnalysis, analyze, get_model_profile
from tests.models import TwoLayerMLP

X = torch.randn(2, 32)
FC1, FC2 = 2 * 32 * 64, 2 * 64 * 10
PARAMS = 32 * 64 + 64 + 64 * 10 + 10  # weights and biases


class WithSpare(nn.Module):
    """An MLP and a module that never runs, and an op with no formula in the root."""

    def __init__(self, uncounted):
        super().__init__()
        self.mlp = TwoLayerMLP()
        self.spare = nn.Linear(4, 4)
        self.tail = uncounted.model(10)

    def forward(self, x):
        return self.tail(self.mlp(x))


def test_by_operator_of_a_module_counts_that_module_only():
    report = analyze(TwoLayerMLP(), (X,))
    assert report.by_operator("fc1")["aten.linear.default"].cost.macs == FC1
    assert report.by_operator()["aten.linear.default"].cost.macs == FC1 + FC2


def test_unsupported_ops_and_uncalled_modules(uncounted):
    report = analyze(WithSpare(uncounted), (X,))
    assert report.uncalled_modules() == {"spare"}
    assert report.unsupported_ops() == {uncounted.name: 1}
    assert report.unsupported_ops("tail") == {uncounted.name: 1}
    assert report.unsupported_ops("mlp") == {}


def test_flop_count_analysis_answers_in_macs_as_fvcore_calls_flops():
    analysis = FlopCountAnalysis(TwoLayerMLP(), X)
    assert analysis.total() == FC1 + FC2
    assert analysis.total("fc2") == FC2
    assert analysis.by_module()["fc1"] == FC1
    assert analysis.by_operator("fc1") == {"aten.linear.default": FC1}
    assert analysis.by_module_and_operator()["fc2"]["aten.linear.default"] == FC2
    assert analysis.unsupported_ops() == {} and analysis.uncalled_modules() == set()


def test_get_model_profile_returns_flops_macs_and_params_from_an_input_shape(capsys):
    flops, macs, params = get_model_profile(TwoLayerMLP(), (2, 32), print_profile=False,
                                            as_string=False)
    # FLOPs: 2 per MAC, one add per bias element (2 x 64 and 2 x 10), one relu per fc1 output.
    assert (flops, macs, params) == (2 * (FC1 + FC2) + 2 * 64 + 2 * 10 + 2 * 64,
                                     FC1 + FC2, PARAMS)
    assert capsys.readouterr().out == ""


def test_get_model_profile_prints_the_profile_and_formats_as_strings(capsys):
    flops, macs, params = get_model_profile(TwoLayerMLP(), args=(X,))
    printed = capsys.readouterr().out
    assert "Summary of TwoLayerMLP" in printed and "Module tree" in printed
    assert macs == "5.38 kMACs"  # 5,376 MACs
    assert params == "2.76 k"  # 2,762 parameters


def test_the_aliases_are_top_level_names():
    assert exportflops.FlopCountAnalysis is FlopCountAnalysis
    assert "get_model_profile" in dir(exportflops)


class BlocksInAList(nn.Module):
    """Two linears in an nn.ModuleList, both run, and a third in a list never run: fvcore's
    ``skip_uncalled_containers`` case (a container's own forward never runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.unused = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        for block in self.used:
            x = block(x)
        return x


def test_a_container_whose_children_ran_is_not_uncalled():
    report = analyze(BlocksInAList(), (torch.randn(2, 4),))
    assert report.uncalled_modules() == {"unused", "unused.0"}


class EmbedThenLinear(nn.Module):
    """A language model's shape in two modules: token ids -> Embedding(100, 16) -> Linear(16, 8)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 8)

    def forward(self, ids):
        return self.head(self.wte(ids))


def test_get_model_profile_builds_token_ids_for_a_model_that_starts_with_an_embedding():
    _, macs, _ = get_model_profile(EmbedThenLinear(), input_shape=(2, 5), print_profile=False,
                                   as_string=False)
    assert macs == 2 * 5 * 16 * 8  # 10 positions, each a (16 -> 8) matmul: the embedding is a read


def test_a_float_input_to_an_embedding_is_named_as_a_dtype_problem():
    with pytest.raises(exportflops.errors.ExportError) as raised:
        analyze(EmbedThenLinear(), (torch.ones(2, 5),))
    hint = str(raised.value).split("torch said")[0]
    assert "dtype" in hint and "integer token ids" in hint and "args=" in hint
    assert "signature" not in hint
