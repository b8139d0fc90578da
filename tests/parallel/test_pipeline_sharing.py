"""Pipeline stages that do the same work are counted once: a stage whose call runs the same ATen
ops on the same shapes as an earlier stage's, module for module, takes that stage's report
under its own module paths (`PipelineStage.counted_as`; node names stay the earlier graph's).
What is checked here: which stages are alike (decided by hand from the models' code), and that
a shared report is the report a count of that stage alone gives, module for module."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.capture.pipeline_split import split_stages
from exportflops.examples.llama import LlamaConfig, llama
from exportflops.api import count_call
from exportflops.parallel.pipeline import analyze_pipeline, layer_split_points
from exportflops.parallel.pipeline.analysis import count_pipeline
from exportflops.parallel.pipeline.mesh import llama_stages

SMALL = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                    ffn_dim=128, max_seq_len=64)
BATCH, SEQ = 2, 16


@pytest.fixture(scope="module")
def small_llama():
    return llama("meta", SMALL, seq_len=SEQ, batch=BATCH)


def test_the_middle_stages_of_a_llama_are_counted_once(small_llama):
    model, args = small_llama
    analysis = analyze_pipeline(model, args, stages=4, schedule="1f1b", device=None)
    # 4 layers in 4 stages: stage 0 holds the embedding, stage 3 the norm and the head; stages
    # 1 and 2 hold one layer each, of equal shapes, and take the same hidden state and tables.
    assert [s.counted_as for s in analysis.record.stages] == [0, 1, 1, 3]
    assert [s.modules for s in analysis.record.stages][1:3] == [["layers.1"], ["layers.2"]]
    whole = exportflops.analyze(model, args, mode="train")
    assert sum((s.forward + s.backward for s in analysis.record.stages),
               exportflops.Cost()) == whole.total


def test_a_shared_stage_report_is_the_count_of_that_stage_alone(small_llama):
    model, args = small_llama
    analysis = analyze_pipeline(model, args, stages=4, schedule="1f1b", device=None)
    stage = split_stages(model, args, None, layer_split_points(model, 4), grad=True)[2]
    alone = exportflops.analyze(stage.module, stage.args, mode="train")
    shared = analysis.stage_reports[2]
    assert shared.by_module() == alone.by_module()  # the paths are stage 2's: layers.2...
    assert "layers.2.attention" in shared.by_module()
    # Node by node; a node's name is its graph's, and the graphs differ in their inputs'
    # names (what torch's split calls the hidden state each stage takes).
    assert [(n.op, n.module, n.phase, n.cost) for n in shared.nodes] == \
        [(n.op, n.module, n.phase, n.cost) for n in alone.nodes]
    assert shared.total == alone.total and shared.params == alone.params


class Blocks(torch.nn.Module):
    """Four Linear(8, 8) blocks of equal parameters; block 2 also doubles its output, so its
    stage runs one op more than the others (the same modules, not the same work)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        for index, block in enumerate(self.blocks):
            block.doubled = index == 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) * 2 if block.doubled else block(x)
        return x


def test_stages_alike_in_modules_but_not_in_ops_are_counted_apart():
    x = torch.randn(2, 8, device="meta", requires_grad=True)
    with torch.device("meta"):
        model = Blocks()
    analysis = analyze_pipeline(model, (x,), stages=4, schedule="gpipe", device=None)
    # Every stage holds one Linear(8, 8) and takes a (2, 8) tensor needing a gradient; stage 2
    # also multiplies by 2, so it is its own; stages 1 and 3 are stage 0's work.
    assert [s.counted_as for s in analysis.record.stages] == [0, 0, 2, 0]
    last = analysis.stage_reports[3].module("blocks.3")
    # Forward 2 x 8 x 8 = 128 MACs; backward: the input's gradient and the weight's, 128 each.
    assert (last.inclusive.macs, last.backward.macs) == (128 + 256, 256)
    doubled = analysis.stage_reports[2]
    assert doubled.total.flops - analysis.stage_reports[1].total.flops == 2 * 8 * 2  # x * 2,
    # forward (16 products) and its gradient (16 more)


def test_the_built_in_llamas_own_stages_take_what_torchs_split_passes(small_llama):
    model, args = small_llama
    ours = llama_stages(model, args[0], 4)
    torchs = split_stages(model, args, None, layer_split_points(model, 4), grad=True)
    assert [s.sources for s in ours] == [s.sources for s in torchs]
    assert [[(tuple(t.shape), t.requires_grad) for t in s.args] for s in ours] == \
        [[(tuple(t.shape), t.requires_grad) for t in s.args] for s in torchs]


class Holder(torch.nn.Module):
    """A linear by its weight, with an 8 x 8 parameter it never reads (a slot kept for loading)
    on some instances only."""

    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))
        if extra:
            self.extra = torch.nn.Parameter(torch.zeros(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


class Pair(torch.nn.Module):
    def __init__(self, extra_on_a: bool) -> None:
        super().__init__()
        self.a, self.b = Holder(extra_on_a), Holder(not extra_on_a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_stages_whose_parameters_sit_in_other_modules_are_counted_apart():
    x = torch.randn(2, 8)
    record = analyze_pipeline(None, (x,), stages=[Pair(True), Pair(False)], device=None,
                              mode="forward", schedule="gpipe").record
    # The same ops on the same shapes, but the unread 8 x 8 parameter is a's in stage 0 and
    # b's in stage 1: the module trees differ, so does each module's parameter count.
    assert [s.counted_as for s in record.stages] == [0, 1]


def test_stages_counted_another_way_are_each_counted_unless_sharing_is_asked_for(small_llama):
    model, args = small_llama
    counted = []

    def count(index, rank, stage):
        counted.append(index)
        return count_call(stage.module, stage.args, stage.kwargs, mode="train")

    record = count_pipeline(model, args, stages=4, device=None, count_stage=count).record
    # A count_stage may depend on the stage's index or rank (a plan that differs per layer):
    # every stage is counted, none shares.
    assert counted == [0, 1, 2, 3] and [s.counted_as for s in record.stages] == [0, 1, 2, 3]
    counted.clear()
    record = count_pipeline(model, args, stages=4, device=None, count_stage=count,
                            share_alike=True).record
    assert counted == [0, 1, 3] and [s.counted_as for s in record.stages] == [0, 1, 1, 3]


def test_a_shared_report_renames_its_measured_modules_too():
    x = torch.randn(4, 8)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    profiled = exportflops.profile(model, (x,), warmup=0, repeat=1)
    moved = profiled.with_paths({"0": "4", "1": "5"})
    assert [m.path for m in moved.runtime.modules] == ["", "4", "5"]
    assert [n.module for n in moved.runtime.nodes] == ["4", "5"]
