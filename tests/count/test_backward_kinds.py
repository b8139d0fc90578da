"""Bytes by kind in train mode: a backward op reading a parameter (or a view of it) reads a
weight; output gradients, saved activations and the parameters' gradients it writes are
activations.

A bias-free Linear y = x @ W^T, W of shape (out, in), has two backward products
(torch/csrc/autograd/FunctionsManual.cpp, mm_mat1_backward / mm_mat2_backward):
  grad_x = grad_y @ W      : (B, out) @ (out, in), reads W and the output gradient;
  grad_W = grad_y^T @ x    : (out, B) @ (B, in), reads the output gradient and the saved input.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.examples.gpt2 import gpt2

FP32 = 4
B, IN, OUT = 2, 8, 4


def _mm(report, shapes):
    (node,) = [n for n in report.nodes if n.phase == "backward" and n.op == "aten.mm.default"
               and [list(t.shape) for t in n.inputs] == shapes]
    return node.cost


@pytest.fixture(scope="module")
def linear_train():
    with torch.device("meta"):
        model = nn.Linear(IN, OUT, bias=False)
        x = torch.zeros(B, IN, requires_grad=True)
    return analyze(model, (x,), mode="train")


def test_the_input_gradient_product_reads_the_weight_as_a_weight(linear_train):
    cost = _mm(linear_train, [[B, OUT], [OUT, IN]])
    assert cost.weight_bytes_read == OUT * IN * FP32 == 128  # W, read once
    assert cost.activation_bytes_read == B * OUT * FP32 == 32  # grad_y
    assert cost.activation_bytes_written == B * IN * FP32 == 64  # grad_x
    assert cost.state_bytes_read == cost.state_bytes_written == 0


def test_the_weight_gradient_product_reads_and_writes_activations(linear_train):
    cost = _mm(linear_train, [[OUT, B], [B, IN]])
    assert cost.weight_bytes_read == 0
    assert cost.activation_bytes_read == (OUT * B + B * IN) * FP32 == 96  # grad_y^T, saved x
    # grad_W is written as an activation: it is a new tensor of the backward, not the weight.
    assert cost.activation_bytes_written == OUT * IN * FP32 == 128
    assert cost.state_bytes_written == 0


def test_the_backward_reads_the_weight_once(linear_train):
    # The transposes around the products are views: they move nothing. So the whole backward
    # reads W exactly once, in grad_x; without grad_x (an input needing no gradient) never.
    assert linear_train.backward.weight_bytes_read == OUT * IN * FP32
    with torch.device("meta"):
        frozen_input = analyze(nn.Linear(IN, OUT, bias=False), (torch.zeros(B, IN),),
                               mode="train")
    assert frozen_input.backward.weight_bytes_read == 0


@pytest.fixture(scope="module")
def gpt2_train():
    model, args = gpt2("meta", seq_len=64)
    return analyze(model, args, mode="train")


# nanoGPT GPT-2 124M: n_embd 768, vocab 50304, the head tied to wte.
D, VOCAB = 768, 50304
LINEARS = {"transformer.h.0.attn.c_attn": D * 3 * D, "transformer.h.0.attn.c_proj": D * D,
           "transformer.h.0.mlp.c_fc": D * 4 * D, "transformer.h.0.mlp.c_proj": 4 * D * D,
           "lm_head": VOCAB * D}


@pytest.mark.parametrize("path", LINEARS)
def test_each_gpt2_linear_backward_reads_its_weight_once(gpt2_train, path):
    # grad_x = grad_y @ W reads the weight (the tied head reads wte's matrix where it is used);
    # grad_W reads the output gradient and the saved input; grad_b sums the output gradient.
    # Every layer computes grad_x: the embeddings are trained, so every input needs a gradient.
    read = sum(n.cost.weight_bytes_read for n in gpt2_train.nodes
               if n.phase == "backward" and n.module == path)
    assert read == FP32 * LINEARS[path]


def test_the_kinds_add_up_on_every_train_node(gpt2_train):
    costs = ([n.cost for n in gpt2_train.nodes] + [m.inclusive for m in gpt2_train.modules]
             + [gpt2_train.forward, gpt2_train.backward, gpt2_train.total])
    for cost in costs:
        parts = (cost.weight_bytes_read, cost.activation_bytes_read, cost.state_bytes_read,
                 cost.activation_bytes_written, cost.state_bytes_written)
        assert min(parts) >= 0
        assert sum(parts) == cost.bytes_read + cost.bytes_written
    # No backward op writes state: a parameter's gradient is a new tensor, not the parameter.
    assert gpt2_train.backward.state_bytes_written == 0


class Scale(nn.Module):
    """x times a constant buffer: autograd saves the buffer for grad_x = grad_y * scale."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(IN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_constant_buffer_read_by_the_backward_is_a_weight():
    with torch.device("meta"):
        report = analyze(Scale(), (torch.zeros(B, IN, requires_grad=True),), mode="train")
    (node,) = [n for n in report.nodes if n.phase == "backward"]
    assert node.op == "aten.mul.Tensor"
    assert node.cost.weight_bytes_read == IN * FP32 == 32  # scale
    assert node.cost.activation_bytes_read == B * IN * FP32 == 64  # grad_y
    assert node.cost.activation_bytes_written == B * IN * FP32 == 64  # grad_x
