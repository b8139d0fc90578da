"""The value between counting and the report (`exportflops.aggregate.Counted`): what a count
returns, `build_report` the one way to a `Report`, and a part of the call (a pipeline stage) a
report of its nodes selected from that value.

Four bias-free Linear(8, 8) layers on a (2, 8) batch, in training: a layer's forward is
2 x 8 x 8 MACs per row, 2 x 2 x 8 x 8 = 256 FLOPs; its backward the weight's gradient
(grad_y^T @ x, the same 256 FLOPs) and, where its input needs one, the input's
(grad_y @ W, 256 again). The batch needs no gradient, so the first layer computes the weight's
alone. Each layer holds 8 x 8 = 64 parameters.
"""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
from torch import nn

from exportflops import Cost, analyze
from exportflops.aggregate import build_report
from exportflops.api import count_call
from exportflops.parallel.pipeline import layer_split_points
from exportflops.parallel.pipeline.slices import node_stages, stage_counted
from exportflops.records import TensorSpec

LAYER_FLOPS = 2 * 2 * 8 * 8  # one (2, 8) x (8, 8) matmul


@pytest.fixture(scope="module")
def stack():
    model = nn.Sequential(*(nn.Linear(8, 8, bias=False) for _ in range(4)))
    return model, torch.randn(2, 8)


def test_analyze_is_the_count_built_into_a_report(stack):
    model, x = stack
    counted = count_call(model, (x,), mode="train")
    assert build_report(counted).model_dump_json() == \
        analyze(model, (x,), mode="train").model_dump_json()


def test_a_stage_is_its_nodes_selected_from_the_count(stack):
    model, x = stack
    counted = count_call(model, (x,), mode="train")
    points = layer_split_points(model, 2)  # before layer 2: layers 0-1, then 2-3
    stage_of = node_stages(counted, points)
    received = [TensorSpec.of((2, 8), torch.float32)]
    stages = [build_report(stage_counted(counted, s, stage_of,
                                         [(name, p) for name, p in model.named_parameters()
                                          if int(name.split(".")[0]) // 2 == s], received))
              for s in range(2)]
    assert [(r.forward.flops, r.backward.flops, r.params) for r in stages] == [
        (2 * LAYER_FLOPS, LAYER_FLOPS + 2 * LAYER_FLOPS, 2 * 64),  # layer 0: weight's only
        (2 * LAYER_FLOPS, 2 * 2 * LAYER_FLOPS, 2 * 64)]
    assert [r.inputs for r in stages] == [received, received]


def test_a_stage_keeps_what_the_count_says_of_the_rank(stack):
    model, x = stack
    counted = dataclasses.replace(count_call(model, (x,)), world_size=4, rank=3,
                                  capture_notes=["a note on the call"])
    stage_of = node_stages(counted, layer_split_points(model, 2))
    stage = build_report(stage_counted(counted, 1, stage_of, [], []))
    assert (stage.world_size, stage.rank, stage.capture_notes) == \
        (4, 3, ["a note on the call"])


def test_symbolic_counts_are_summed_into_their_expansion(stack):
    # Layer k's node given flops (s + k)(s + 1) = s^2 + (k + 1)s + k and macs 2(s + k), by
    # hand: the model's total is 4s^2 + 10s + 6 FLOPs and 8s + 12 MACs, each module's its
    # own node's, all written expanded (sympy's canonical sum of monomials).
    model, x = stack
    s = sympy.Symbol("s", integer=True, positive=True)
    counted = count_call(model, (x,))
    nodes = [node.model_copy(update={"cost": Cost(flops=(s + k) * (s + 1), macs=2 * (s + k))})
             for k, node in enumerate(counted.nodes)]
    report = build_report(dataclasses.replace(counted, nodes=nodes))
    assert report.total.flops == 4 * s**2 + 10 * s + 6
    assert report.total.macs == 8 * s + 12
    assert [report.module(str(k)).inclusive.flops for k in range(4)] == [
        s**2 + (k + 1) * s + k for k in range(4)]
    assert report.operators["aten.linear.default"].cost.flops == 4 * s**2 + 10 * s + 6
