"""How often an analysis runs a model's ``forward`` Python, against ``FlopCounterMode`` (one
eager run): the number docs/api.md states. torch.export runs the forward once; the fast path
adds its cheap pass before it, unless no two modules of the model are alike (then no block
can repeat and the cheap pass is skipped). A repeated block's forward is not run by the
export (a stub stands in for it), so it runs once, in the cheap pass.

Attributes a forward sets on its module are put back after each run, by torch.export and by
the cheap pass alike: the counts here are kept on an object the modules share."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from exportflops import analyze
from exportflops.capture.blocks import plan_blocks


class Doubled(nn.Module):
    """x * 2, counting its runs under its name in ``runs``."""

    def __init__(self, name: str, runs: Counter) -> None:
        super().__init__()
        self.name, self.runs = name, runs

    def forward(self, x):
        self.runs[self.name] += 1
        return x * 2


class Stack(nn.Module):
    """Three identical parameterless blocks after a Linear; counts its own runs as "model"."""

    def __init__(self, runs: Counter) -> None:
        super().__init__()
        self.runs = runs
        self.proj = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(Doubled(f"blocks.{i}", runs) for i in range(3))

    def forward(self, x):
        self.runs["model"] += 1
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return x


class Single(nn.Module):
    """A Linear and one block: no two modules alike, so nothing can repeat."""

    def __init__(self, runs: Counter) -> None:
        super().__init__()
        self.runs = runs
        self.proj = nn.Linear(4, 4)
        self.block = Doubled("block", runs)

    def forward(self, x):
        self.runs["model"] += 1
        return self.block(self.proj(x))


X = torch.randn(2, 4)


def runs_of(build, how: str, mode: str = "forward") -> Counter:
    runs: Counter = Counter()
    model = build(runs)
    if how == "FlopCounterMode":
        with FlopCounterMode(display=False):
            model(X)
    else:
        analyze(model, (X,), mode=mode, fast=how == "fast")
    return runs


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_forward_runs_once_with_the_full_export_as_under_flop_counter_mode(mode):
    # FlopCounterMode runs the model once; torch.export traces it once.
    once = Counter({"model": 1, "blocks.0": 1, "blocks.1": 1, "blocks.2": 1})
    assert runs_of(Stack, "FlopCounterMode") == once
    assert runs_of(Stack, "full", mode) == once


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_the_fast_path_runs_forward_twice_and_a_repeated_block_once(mode):
    # blocks.1 and blocks.2 repeat blocks.0 (equal trees, inputs, outputs and ops).
    assert {p: r.model for p, r in plan_blocks(Stack(Counter()), (X,), {}).repeats.items()} \
        == {"blocks.1": "blocks.0", "blocks.2": "blocks.0"}
    # The model and the block traced: the cheap pass, then the export, 2 runs each. The
    # repeats: the cheap pass only (the export runs their stub), 1 run each.
    assert runs_of(Stack, "fast", mode) == \
        Counter({"model": 2, "blocks.0": 2, "blocks.1": 1, "blocks.2": 1})


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_with_no_two_modules_alike_the_fast_path_runs_forward_once(mode):
    # Linear and Doubled: one of each class, so no cheap pass; the export's one run.
    assert runs_of(Single, "fast", mode) == Counter({"model": 1, "block": 1})


class CachesOnFirstCall(nn.Module):
    """Two alike blocks, each caching a tensor on itself at its first call and counting its
    calls in an int attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.cached = None
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.cached is None:
            self.cached = torch.ones(4)
        return self.linear(x) + self.cached


@pytest.mark.filterwarnings("ignore:The tensor attributes")  # torch.export's, on `cached`
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_attributes_a_forward_sets_are_as_they_were_after_the_analysis(fast):
    model = nn.Sequential(CachesOnFirstCall(), CachesOnFirstCall())
    analyze(model, (X,), fast=fast)
    # Before: the fast path's cheap pass left its fake tensor cached on the user's module, and
    # the model's next real run returned a FakeTensor.
    assert [(block.cached, block.calls) for block in model] == [(None, 0), (None, 0)]
    out = model(X)
    assert type(out) is torch.Tensor and [block.calls for block in model] == [1, 1]


class FillsItsDict(nn.Module):
    """A cache filled in place in a dict the module already holds, as LeViT's attention keeps
    its bias per device."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.bias_cache = {}

    def forward(self, x):
        if str(x.device) not in self.bias_cache:
            self.bias_cache[str(x.device)] = torch.ones(4)
        return self.linear(x) + self.bias_cache[str(x.device)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_a_container_a_forward_fills_in_place_is_emptied_again(fast):
    model = nn.Sequential(FillsItsDict(), FillsItsDict())
    analyze(model, (X,), fast=fast)
    assert [block.bias_cache for block in model] == [{}, {}]
    assert type(model(X)) is torch.Tensor


def test_a_container_the_stubbed_exports_model_block_fills_is_emptied_in_the_users_module():
    # The first block takes X, which needs no gradient, and the others a block's output: with
    # grad on, block 1 is the model of block 2, and the export runs it through a shallow copy
    # that shares its dict with the user's block (export puts back the copy's own attribute).
    model = nn.Sequential(FillsItsDict(), FillsItsDict(), FillsItsDict())
    with torch.enable_grad():
        analyze(model, (X,))
    assert [block.bias_cache for block in model] == [{}, {}, {}]


class HooksOnFirstCall(nn.Module):
    """Installs a hook on its first call and sets a flag saying so, as transformers installs
    its output-capturing hooks (``_output_capturing_hooks_installed``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        if not getattr(self, "_hooked", False):
            self.linear.register_forward_hook(lambda module, args, out: self.seen.append(1))
            self._hooked = True
        return self.linear(x)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "full"])
def test_hooks_a_first_call_installs_are_put_back_with_their_flag(fast):
    model = nn.Sequential(HooksOnFirstCall(), HooksOnFirstCall())
    analyze(model, (X,), fast=fast)
    for block in model:
        block.seen.clear()
    model(X)
    assert [block.seen for block in model] == [[1], [1]]  # one hook each, not two
