"""The RNN family: lstm, gru, rnn_tanh, rnn_relu and their cells, forward and train-mode backward.

Sizes: T = 5 steps, B = 3 sequences, I = IN = 8 input features, H = 16 hidden units, P = 4 for the
LSTM projection. One step of a cell with G gates multiplies the input by W_ih (G H x I) and the
state by W_hh (G H x H): G H (IN + H) MACs per token (one token = one step of one sequence) per
direction per layer. FLOPs are 2 per MAC, plus 1 per bias element added (b_ih and b_hh, G H
each), plus the cell's elementwise math at 1 FLOP per op per element (exportflops/formulas/
pointwise.py): LSTM 13 H (gates add 4, 3 sigmoid + 1 tanh 4, c' = f*c + i*g 3, tanh(c') and
o * tanh(c') 2), GRU 10 H (r and z: add + sigmoid 4; n: multiply, add, tanh 3; h': subtract,
multiply, add 3), RNN 2 H (add, tanh or relu).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.utils.flop_counter import FlopCounterMode

from exportflops import analyze
from exportflops.formulas import FORMULAS, OpCall, TensorMeta

T, B, IN, H, P = 5, 3, 8, 16, 4
TOKENS = T * B  # 15


def lstm_macs(inputs, hidden=H, state=H):
    return TOKENS * 4 * hidden * (inputs + state)


# (module, input shape, forward MACs, forward FLOPs), each derived by hand.
FORWARD = {
    # 15 tokens x 4 gates x 16 x (8 + 16) = 23,040 MACs; biases 2 x 64 and 13 x 16 per token.
    "lstm": (lambda: nn.LSTM(IN, H), (T, B, IN),
             lstm_macs(IN), 2 * lstm_macs(IN) + TOKENS * (2 * 4 * H + 13 * H)),
    "lstm_no_bias": (lambda: nn.LSTM(IN, H, bias=False), (T, B, IN),
                     lstm_macs(IN), 2 * lstm_macs(IN) + TOKENS * 13 * H),
    # Layer 0 reads IN features, layer 1 reads both directions' H: 2 H. Two directions each.
    "lstm_2_layers_bidirectional_batch_first": (
        lambda: nn.LSTM(IN, H, num_layers=2, bidirectional=True, batch_first=True), (B, T, IN),
        2 * lstm_macs(IN) + 2 * lstm_macs(2 * H),
        2 * (2 * lstm_macs(IN) + 2 * lstm_macs(2 * H)) + 4 * TOKENS * (2 * 4 * H + 13 * H)),
    # The recurrent state is P wide (W_hh: 4H x P), and h = W_hr (o * tanh(c')) adds P x H.
    "lstm_proj": (lambda: nn.LSTM(IN, H, proj_size=P), (T, B, IN),
                  lstm_macs(IN, state=P) + TOKENS * P * H,
                  2 * (lstm_macs(IN, state=P) + TOKENS * P * H)
                  + TOKENS * (2 * 4 * H + 13 * H)),
    # 3 gates, no biases: 15 x 48 x 24 = 17,280 MACs.
    "gru_no_bias": (lambda: nn.GRU(IN, H, bias=False), (T, B, IN),
                    TOKENS * 3 * H * (IN + H), 2 * TOKENS * 3 * H * (IN + H) + TOKENS * 10 * H),
    "gru": (lambda: nn.GRU(IN, H), (T, B, IN),
            TOKENS * 3 * H * (IN + H),
            2 * TOKENS * 3 * H * (IN + H) + TOKENS * (2 * 3 * H + 10 * H)),
    "rnn_tanh": (lambda: nn.RNN(IN, H), (T, B, IN),
                 TOKENS * H * (IN + H), 2 * TOKENS * H * (IN + H) + TOKENS * (2 * H + 2 * H)),
    "rnn_relu_2_layers": (lambda: nn.RNN(IN, H, num_layers=2, nonlinearity="relu"), (T, B, IN),
                          TOKENS * H * (IN + H) + TOKENS * H * (H + H),
                          2 * (TOKENS * H * (IN + H) + TOKENS * H * 2 * H)
                          + 2 * TOKENS * (2 * H + 2 * H)),
    # Cells: one step of B rows.
    "lstm_cell": (lambda: nn.LSTMCell(IN, H), (B, IN),
                  B * 4 * H * (IN + H), 2 * B * 4 * H * (IN + H) + B * (2 * 4 * H + 13 * H)),
    "gru_cell": (lambda: nn.GRUCell(IN, H), (B, IN),
                 B * 3 * H * (IN + H), 2 * B * 3 * H * (IN + H) + B * (2 * 3 * H + 10 * H)),
    "rnn_tanh_cell": (lambda: nn.RNNCell(IN, H), (B, IN),
                      B * H * (IN + H), 2 * B * H * (IN + H) + B * (2 * H + 2 * H)),
    "rnn_relu_cell_no_bias": (lambda: nn.RNNCell(IN, H, nonlinearity="relu", bias=False), (B, IN),
                              B * H * (IN + H), 2 * B * H * (IN + H) + B * 2 * H),
}


@pytest.mark.parametrize("case", FORWARD, ids=list(FORWARD))
def test_forward_counts_match_the_hand_derivation(case):
    build, shape, macs, flops = FORWARD[case]
    report = analyze(build().eval(), (torch.randn(shape),))
    assert report.unsupported_ops() == {}
    assert report.total.macs == macs
    assert report.total.flops == flops


@pytest.mark.parametrize("case", ["lstm_2_layers_bidirectional_batch_first", "lstm_proj",
                                  "gru", "rnn_relu_2_layers", "lstm_cell", "gru_cell"])
def test_forward_equals_torchs_own_decomposition(case):
    """run_decompositions() rewrites each RNN op into addmm, sigmoid, mul...: counted by the
    other families' formulas, the same FLOPs and MACs."""
    build, shape, _, _ = FORWARD[case]
    program = torch.export.export(build().eval(), (torch.randn(shape),))
    whole, decomposed = analyze(program), analyze(program.run_decompositions())
    assert decomposed.unsupported_ops() == {}
    assert (whole.total.flops, whole.total.macs) == (decomposed.total.flops,
                                                      decomposed.total.macs)


@pytest.mark.parametrize("case", ["lstm", "gru", "rnn_tanh", "lstm_cell", "gru_cell"])
def test_matmul_flops_agree_with_flop_counter_mode_on_meta(case):
    """FlopCounterMode has no RNN formula; on meta tensors torch runs the composite
    implementation, whose addmm it counts (2 FLOPs per MAC, no bias). On CPU an LSTM runs
    oneDNN's mkldnn_rnn_layer, which it does not count at all."""
    build, shape, macs, _ = FORWARD[case]
    with torch.device("meta"):
        model, x = build().eval(), torch.randn(shape)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    assert counter.get_total_flops() == 2 * macs == analyze(model, (x,)).total.matmul_flops


def test_dropout_between_layers_in_training():
    # Layer 0's output (15 tokens x 16) is dropped out before layer 1: 2 FLOPs per element.
    model = nn.LSTM(IN, H, num_layers=2, dropout=0.5).train()
    macs = lstm_macs(IN) + lstm_macs(H)
    report = analyze(model, (torch.randn(T, B, IN),))
    assert report.total.flops == (2 * macs + 2 * TOKENS * (2 * 4 * H + 13 * H)
                                  + 2 * TOKENS * H)


def test_a_dynamic_batch_is_a_formula():
    report = analyze(nn.LSTM(IN, H), (torch.randn(T, B, IN),),
                     dynamic_shapes=({1: Dim("batch", min=2, max=64)},))
    assert report.evaluate(batch=7).total.macs == T * 7 * 4 * H * (IN + H)


def test_packed_data_counts_the_real_tokens():
    """lstm.data (a PackedSequence; export cannot capture packing, so its op is called here):
    lengths 5, 3, 2 hold 10 tokens, each one step of a 2-layer LSTM."""
    tokens = 5 + 3 + 2
    params = [TensorMeta((4 * H, IN), torch.float32), TensorMeta((4 * H, H), torch.float32),
              TensorMeta((4 * H, H), torch.float32), TensorMeta((4 * H, H), torch.float32)]
    call = OpCall(torch.ops.aten.lstm.data, {
        "data": TensorMeta((tokens, IN), torch.float32),
        "batch_sizes": TensorMeta((5,), torch.int64),
        "hx": [TensorMeta((2, 3, H), torch.float32)] * 2, "params": params, "has_biases": False,
        "num_layers": 2, "dropout": 0.0, "train": False, "bidirectional": False}, ())
    cost = FORMULAS.lookup(call.op).formula(call)
    macs = tokens * 4 * H * (IN + H) + tokens * 4 * H * (H + H)
    assert cost.macs == macs
    assert cost.flops == 2 * macs + 2 * tokens * 13 * H


# Train mode. The fused CPU kernel (oneDNN, LSTM only) returns every gradient: the data
# gradients dgates @ W (one MAC per weight element per token) and the weight gradients
# dgates^T @ x (the same again): 2 x the forward MACs. Its elementwise backward per token:
# 22 H (o * tanh(c'): 2 multiplies + tanh_backward 3; f*c + i*g: 4 multiplies; 3
# sigmoid_backward + 1 tanh_backward: 12; the two gradients of c' added: 1) + 1 per state
# element (h feeds the output and the next step: 1 add), and each bias gradient sums 4 H per
# token.
LSTM_FUSED_BACKWARD_FLOPS = (2 * 2 * lstm_macs(IN) + TOKENS * (22 * H + H)
                             + 2 * TOKENS * 4 * H)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_lstm_backward_on_cpu_is_the_fused_kernel():
    report = analyze(nn.LSTM(IN, H), (torch.randn(T, B, IN),), mode="train")
    ops = {n.op for n in report.nodes if n.phase == "backward" and n.status == "counted"}
    assert ops == {"aten.mkldnn_rnn_layer_backward.default"}
    assert report.backward.macs == 2 * lstm_macs(IN)
    assert report.backward.flops == LSTM_FUSED_BACKWARD_FLOPS


def test_lstm_backward_on_meta_follows_what_needs_a_gradient():
    """On meta, autograd differentiates torch's composite LSTM step by step: the weights get
    their gradient at every step (15 x 64 x 8 and 15 x 64 x 16 MACs), the state at steps 1..4
    only (h0 is zeros, the data needs none: (T - 1) x 3 x 64 x 16), the input none."""
    with torch.device("meta"):
        model, x = nn.LSTM(IN, H), torch.randn(T, B, IN)
    report = analyze(model, (x,), mode="train")
    assert report.backward.macs == (TOKENS * 4 * H * IN + TOKENS * 4 * H * H
                                    + (T - 1) * B * 4 * H * H)
    assert report.uncounted == []


class WithState(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        return self.rnn(x, state if len(state) > 1 else state[0])


def test_lstm_backward_with_every_gradient_matches_the_fused_kernel_on_meta():
    """Input and initial state need gradients: the composite's backward is 2 x the forward
    MACs, as the fused kernel. Its elementwise work is the kernel's plus the adds that sum
    the weight and bias gradients of the 5 steps (4 adds of 64 x (8 + 16) + 2 x 64 each)."""
    with torch.device("meta"):
        model = WithState(nn.LSTM(IN, H))
        args = (torch.randn(T, B, IN, requires_grad=True),
                torch.randn(1, B, H, requires_grad=True), torch.randn(1, B, H, requires_grad=True))
    report = analyze(model, args, mode="train")
    assert report.backward.macs == 2 * lstm_macs(IN)
    assert report.backward.flops == (LSTM_FUSED_BACKWARD_FLOPS
                                     + (T - 1) * (4 * H * (IN + H) + 2 * 4 * H))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_gru_backward_follows_what_needs_a_gradient(device):
    """No fused GRU kernel runs on CPU: autograd differentiates the composite on both devices.
    Weights at every step, the state at steps 1..4, the input not at all."""
    with torch.device(device):
        model, x = nn.GRU(IN, H), torch.randn(T, B, IN)
    report = analyze(model, (x,), mode="train")
    assert report.backward.macs == TOKENS * 3 * H * (IN + H) + (T - 1) * B * 3 * H * H
    assert report.uncounted == []


def test_gru_backward_with_every_gradient_is_twice_the_forward():
    model = WithState(nn.GRU(IN, H))
    args = (torch.randn(T, B, IN, requires_grad=True), torch.randn(1, B, H, requires_grad=True))
    report = analyze(model, args, mode="train")
    assert report.backward.macs == 2 * TOKENS * 3 * H * (IN + H)


def test_cell_backward_trains_both_weights():
    # h0 is zeros and x needs no gradient: grad W_ih (3 x 64 x 8) and grad W_hh (3 x 64 x 16).
    report = analyze(nn.LSTMCell(IN, H), (torch.randn(B, IN),), mode="train")
    assert report.backward.macs == B * 4 * H * (IN + H)
    assert report.uncounted == []


def _cudnn_backward(mask):
    """_cudnn_rnn_backward of a 1-layer biased LSTM (4 weights per layer), as autograd calls it
    on CUDA; the op is built by hand (no GPU here)."""
    weights = [TensorMeta((4 * H, IN), torch.float32), TensorMeta((4 * H, H), torch.float32),
               TensorMeta((4 * H,), torch.float32), TensorMeta((4 * H,), torch.float32)]
    call = OpCall(torch.ops.aten._cudnn_rnn_backward.default, {
        "input": TensorMeta((T, B, IN), torch.float32), "weight": weights, "weight_stride0": 4,
        "mode": 2, "num_layers": 1, "bidirectional": False, "output_mask": mask}, ())
    return FORMULAS.lookup(call.op).formula(call)


@pytest.mark.parametrize(("mask", "macs", "flops"), [
    # Everything: the fused kernel's count above.
    ([True, True, True, True], 2 * lstm_macs(IN), LSTM_FUSED_BACKWARD_FLOPS),
    # No weight gradients (frozen weights): the data pass only, no dgates^T @ x, no bias sums.
    ([True, True, True, False], lstm_macs(IN), 2 * lstm_macs(IN) + TOKENS * (22 * H + H)),
    # Weights only: cuDNN runs the data pass anyway (its reserve feeds the weight pass).
    ([False, False, False, True], 2 * lstm_macs(IN), LSTM_FUSED_BACKWARD_FLOPS),
], ids=["all", "frozen_weights", "weights_only"])
def test_cudnn_backward_follows_its_output_mask(mask, macs, flops):
    cost = _cudnn_backward(mask)
    assert (cost.macs, cost.flops) == (macs, flops)


def _count(op, args):
    return FORMULAS.lookup(op).formula(OpCall(op, args, ()))


def _f32(*shape):
    return TensorMeta(shape, torch.float32)


def test_cuda_fused_cells_count_their_elementwise_work():
    """CUDA's LSTM and GRU cells: the two gate matmuls are mm nodes of their own, the fused
    kernel adds both biases and runs the cell's elementwise math (13 H and 10 H per row)."""
    aten = torch.ops.aten
    lstm = _count(aten._thnn_fused_lstm_cell.default, {
        "input_gates": _f32(B, 4 * H), "hidden_gates": _f32(B, 4 * H), "cx": _f32(B, H),
        "input_bias": _f32(4 * H), "hidden_bias": _f32(4 * H)})
    assert (lstm.flops, lstm.macs) == (B * (2 * 4 * H + 13 * H), 0)
    gru = _count(aten._thnn_fused_gru_cell.default, {
        "input_gates": _f32(B, 3 * H), "hidden_gates": _f32(B, 3 * H), "hx": _f32(B, H),
        "input_bias": None, "hidden_bias": None})
    assert gru.flops == B * 10 * H
    # Backward: the elementwise backward of the cell (LSTM 22 H, less the add of c''s two
    # gradients when none comes from the next step; GRU 15 H) and the bias sums over the rows
    # (LSTM one 4 H sum shared by both biases, GRU one 3 H sum per bias).
    lstm_back = _count(aten._thnn_fused_lstm_cell_backward_impl.default, {
        "grad_hy": _f32(B, H), "grad_cy": None, "cx": _f32(B, H), "cy": _f32(B, H),
        "workspace": _f32(B, 4 * H), "has_bias": True})
    assert lstm_back.flops == B * (21 * H + 4 * H)
    gru_back = _count(aten._thnn_fused_gru_cell_backward.default, {
        "grad_hy": _f32(B, H), "workspace": _f32(B, 5 * H), "has_bias": True})
    assert gru_back.flops == B * (15 * H + 2 * 3 * H)


def test_projected_lstm_backward_is_the_composite():
    """oneDNN has no projection, so autograd differentiates the composite (x needs no
    gradient, h0 is zeros): the weight gradients at every step, W_ih 15 x 64 x 8, W_hh
    15 x 64 x 4, W_hr 15 x 4 x 16; the gradient of o * tanh(c') through W_hr at every step
    (15 x 16 x 4); that of h through W_hh at steps 1..4 (4 x 3 x 64 x 4)."""
    report = analyze(nn.LSTM(IN, H, proj_size=P), (torch.randn(T, B, IN),), mode="train")
    assert report.backward.macs == (TOKENS * 4 * H * IN + TOKENS * 4 * H * P + TOKENS * P * H
                                    + TOKENS * H * P + (T - 1) * B * 4 * H * P)
    assert report.uncounted == []
