"""Train mode: gradients flow through in-place writes into a view, as autograd's CopySlices has it.

Transformers' DeepSeek-V3 attention (modeling_deepseek_v3.py, transformers 5.24) builds its keys
as ``key = k_nope.new_empty(...)``, ``key[..., :nope] = k_nope``, ``key[..., nope:] = k_rope``;
the exported graph's SDPA then reads ``new_empty`` (make_fx gives the new node to the slice only),
so the key's gradient, and SDPA's dK bmm, went missing. MLA's query/key head dim (nope + rope) is
not its value head dim: SDPA on cpu then runs its math fallback, whose backward is four bmms.

SDPA's backward per (batch, head), L queries, S keys, head dims E_qk and E_v, 2 FLOPs per MAC:
  1. dV = P^T dO   (S x L) @ (L x E_v)    L * S * E_v MACs
  2. dP = dO V^T   (L x E_v) @ (E_v x S)  L * S * E_v MACs
  3. dQ = dS K     (L x S) @ (S x E_qk)   L * S * E_qk MACs
  4. dK = dS^T Q   (S x L) @ (L x E_qk)   L * S * E_qk MACs
as torch.utils.flop_counter's ``sdpa_backward_flop_count`` steps 2 and 3 (its step 1 is the q.k
a fused kernel recomputes, which the math fallback keeps from the forward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from exportflops import analyze
from exportflops.graph.writes import current_values

B, H, L, WIDTH = 2, 2, 8, 16
NOPE, ROPE, E_V = 8, 4, 8  # E_qk = NOPE + ROPE = 12 != E_v
E_QK = NOPE + ROPE


class KeysWrittenIntoSlices(nn.Module):
    """DeepSeek-V3's attention in small: keys copied into slices of an empty tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(WIDTH, H * E_QK, bias=False)
        self.k_nope = nn.Linear(WIDTH, H * NOPE, bias=False)
        self.k_rope = nn.Linear(WIDTH, H * ROPE, bias=False)
        self.v = nn.Linear(WIDTH, H * E_V, bias=False)

    def forward(self, x):  # x: (B, L, WIDTH)
        def heads(t):  # (B, L, H * E) -> (B, H, L, E)
            return t.view(B, L, H, -1).transpose(1, 2)

        k_nope, k_rope = heads(self.k_nope(x)), heads(self.k_rope(x))
        key = k_nope.new_empty(B, H, L, E_QK)
        key[..., :NOPE] = k_nope
        key[..., NOPE:] = k_rope
        return F.scaled_dot_product_attention(heads(self.q(x)), key, heads(self.v(x)))


def test_sdpa_backward_differentiates_keys_written_into_slices():
    report = analyze(KeysWrittenIntoSlices(), (torch.randn(B, L, WIDTH),), mode="train")
    bmm = report.by_operator()["aten.bmm.default"]
    per_head_macs = L * L * E_V + L * L * E_V + L * L * E_QK + L * L * E_QK  # dV, dP, dQ, dK
    assert bmm.backward_calls == 4
    assert bmm.backward.flops == 2 * B * H * per_head_macs  # 2 * 2 * 2 * 1280 = 10,240


def test_key_projections_get_their_weight_gradients():
    """Each key projection's weight gradient, dW = dY^T X: (out x B*L) @ (B*L x WIDTH)."""
    report = analyze(KeysWrittenIntoSlices(), (torch.randn(B, L, WIDTH),), mode="train")
    for name, out in (("k_nope", H * NOPE), ("k_rope", H * ROPE)):
        mm = report.by_operator(name)["aten.mm.default"]
        assert mm.backward.flops == 2 * out * B * L * WIDTH  # the input needs no gradient


def test_backward_matmuls_agree_with_flop_counter_mode_on_a_real_cpu_run():
    model, x = KeysWrittenIntoSlices(), torch.randn(B, L, WIDTH)
    loss = model(x).sum()
    counter = FlopCounterMode(display=False)
    with counter:
        loss.backward()
    torch_counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    operators = analyze(model, (x,), mode="train").by_operator()
    ours = {op: operators[f"{op}.default"].backward.flops for op in ("aten.bmm", "aten.mm")}
    assert ours == torch_counts


class ReadBeforeAndAfterWrite(nn.Module):
    """A linear reads a zero buffer, then another reads it after a linear's output is copied
    into half of it: only the second's input holds a value that needs a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.into = nn.Linear(WIDTH, WIDTH // 2, bias=False)
        self.before = nn.Linear(WIDTH, WIDTH, bias=False)
        self.after = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x):  # x: (L, WIDTH)
        buffer = x.new_zeros(L, WIDTH)
        early = self.before(buffer)
        buffer[:, : WIDTH // 2] = self.into(x)
        return early + self.after(buffer)


def test_a_read_before_the_write_needs_no_gradient_and_one_after_it_does():
    operators = analyze(ReadBeforeAndAfterWrite(), (torch.randn(L, WIDTH),),
                        mode="train").by_operator
    weight_gradient = 2 * WIDTH * L * WIDTH  # dW = dY^T X, (WIDTH x L) @ (L x WIDTH)
    input_gradient = 2 * L * WIDTH * WIDTH  # dX = dY W, (L x WIDTH) @ (WIDTH x WIDTH)
    assert operators("before")["aten.mm.default"].backward.flops == weight_gradient
    assert operators("after")["aten.mm.default"].backward.flops == (weight_gradient
                                                                    + input_gradient)
    into_weight_gradient = 2 * (WIDTH // 2) * L * WIDTH
    assert operators("into")["aten.mm.default"].backward.flops == into_weight_gradient


class WriteIntoMaxValues(nn.Module):
    def forward(self, x):
        values, indices = x.max(-1)
        values.mul_(2)
        return values, indices + 1


def test_outputs_of_an_op_returning_new_tensors_are_not_views_of_each_other():
    """``max``'s values and indices are two tensors: a write into one is not read by the other."""
    graph = torch.export.export(WriteIntoMaxValues(), (torch.randn(3, 4),)).graph
    [add] = [n for n in graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert (add, add.args[0]) not in current_values(graph)
