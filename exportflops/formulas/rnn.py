"""Recurrent networks: ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu`` (``.input`` and packed
``.data``), their cells, and the fused kernels autograd runs for them on CPU (oneDNN) and CUDA.

Export keeps ``aten.lstm`` and friends as single nodes. Their work, per token (a time step of
one sequence) per direction per layer, with G gates (LSTM 4, GRU 3, RNN 1), hidden size H,
recurrent state size P (``proj_size``, else H) and layer input size I (the input's features in
layer 0, ``D x P`` above, D = 2 when bidirectional):

1. MACs: every weight matrix is used once per token as a matrix-vector product, so the MACs
   are the sum of its elements: ``G H x I`` (input), ``G H x P`` (recurrent), ``P x H`` (the
   LSTM projection). 2 FLOPs per MAC, as in `matmul`.
2. Bias adds: 1 FLOP per bias element (``b_ih`` and ``b_hh`` are added separately, as
   ``addmm`` does in the decomposition torch's own ``run_decompositions`` produces).
3. The cell's elementwise math, 1 FLOP per op per element as `pointwise` counts it
   (``CELL_FLOPS``, in units of H).
4. Dropout between layers in training, 2 FLOPs per element (`pointwise.dropout`).

Backward kernels (``mkldnn_rnn_layer_backward``, ``_cudnn_rnn_backward``, ...) compute the data
gradients (input and recurrent state, one MAC per weight element per token) whatever the model
needs, and the weight gradients (the same again; cuDNN skips them for frozen weights): 2x the
forward MACs, plus the elementwise
backward of the cell (``CELL_BACKWARD_FLOPS``) and the bias gradients (a sum over tokens, 1 FLOP
per element read, per bias). Where no fused kernel runs (meta tensors, GRU and RNN on CPU, LSTM
with projections), autograd differentiates torch's composite implementation op by op and those
ops (``mm``, ``sigmoid_backward``, ...) are counted by their own formulas.
"""

from __future__ import annotations

import math


from .registry import FLOPS_PER_MAC, Cost, OpCall, TensorMeta, register_formula, aten


#: Gates per cell: LSTM input, forget, cell, output; GRU reset, update, new; RNN one.
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}

#: Elementwise FLOPs per hidden unit per token of one cell step (1 per op per element):
#: LSTM: gates = ih + hh (4), 3 sigmoids + 1 tanh (4), c' = f*c + i*g (3), h = o * tanh(c') (2).
#: GRU: r and z: add, sigmoid (4); n = tanh(i_n + r * h_n): multiply, add, tanh (3);
#: h' = (h - n) * z + n: subtract, multiply, add (3). RNN: ih + hh (1), tanh or relu (1).
CELL_FLOPS = {"lstm": 13, "gru": 10, "rnn_tanh": 2, "rnn_relu": 2}

#: Elementwise backward FLOPs per hidden unit per token: each forward op differentiated as
#: `gradients` counts it (a multiply 1 per operand gradient, tanh_backward and
#: sigmoid_backward 3, threshold_backward 1, a negation 1, an add or a chunk 0).
#: LSTM: h = o * tanh(c'): 2 multiplies + tanh_backward (5); c' = f*c + i*g: 4 multiplies (4);
#: 3 sigmoid_backward + 1 tanh_backward on the gates (12); c' feeds tanh and the next step, so
#: its two gradients are added (1). GRU: h' = (h - n) * z + n: 2 multiplies, the negation into
#: n, the add of n's two gradients (4); n: tanh_backward, 2 multiplies (5); r, z:
#: sigmoid_backward (6). RNN: tanh_backward (3) or threshold_backward (1).
CELL_BACKWARD_FLOPS = {"lstm": 22, "gru": 15, "rnn_tanh": 3, "rnn_relu": 1}
#: Gradient adds per element of the recurrent state h (size P): one per consumer beyond the
#: first. h feeds the layer's output and the next step's recurrent matmul; a GRU's h also feeds
#: the next step's h - n.
STATE_GRADIENT_ADDS = {"lstm": 1, "gru": 2, "rnn_tanh": 1, "rnn_relu": 1}

#: Dropout between layers in training: keep mask and scale per element.
DROPOUT_FLOPS = 2

#: The ``mode`` argument of the fused kernels (cuDNN's and oneDNN's enumeration).
KERNEL_MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}


def _tokens(x: TensorMeta):
    """Time steps x batch: every row of a (T, B, I), (B, T, I), (T, I) or packed (N, I) input."""
    return math.prod(x.shape[:-1])


def _numel(t: TensorMeta | None):
    return 0 if t is None else t.numel


def _groups(weights: list, groups: int, has_biases: bool) -> list[tuple]:
    """Split a flat weight list, layer by layer and direction by direction, into
    ``(w_ih, w_hh, b_ih, b_hh, w_hr)``: 2 matrices, 2 biases when ``has_biases``, and the LSTM
    projection when the stride has one more (torch's ``_flat_weights`` order)."""
    stride = len(weights) // groups
    plain = 4 if has_biases else 2
    out = []
    for g in range(groups):
        w = weights[g * stride:(g + 1) * stride]
        biases = (w[2], w[3]) if has_biases else (None, None)
        out.append((w[0], w[1], *biases, w[plain] if stride > plain else None))
    return out


def _step_work(kind: str, tokens, w_ih, w_hh, b_ih, b_hh, w_hr) -> tuple:
    """(MACs, non-MAC FLOPs) of one layer in one direction over ``tokens``."""
    hidden = w_hh.shape[0] // GATES[kind]
    macs = tokens * (w_ih.numel + w_hh.numel + _numel(w_hr))
    flops = tokens * (_numel(b_ih) + _numel(b_hh) + CELL_FLOPS[kind] * hidden)
    return macs, flops


def _step_backward(kind: str, tokens, w_ih, w_hh, biases: int, *, weights: bool = True,
                   w_hr: TensorMeta | None = None) -> tuple:
    """(MACs, non-MAC FLOPs) of one layer's backward in one direction: the data gradients
    (``dgates @ W`` for input and state, after the cell's elementwise backward), and when
    ``weights`` the weight gradients (``dgates^T @ x``) and ``biases`` bias gradients."""
    (gate_rows, state), hidden = w_hh.shape, w_hh.shape[0] // GATES[kind]
    per_token = w_ih.numel + w_hh.numel + _numel(w_hr)
    cell = CELL_BACKWARD_FLOPS[kind] * hidden + STATE_GRADIENT_ADDS[kind] * state
    macs = tokens * per_token * (1 + weights)
    flops = tokens * (cell + biases * gate_rows * weights)
    return macs, flops


def _stack(call: OpCall, kind: str, x: TensorMeta) -> Cost:
    layers, directions = call["num_layers"], 1 + bool(call["bidirectional"])
    groups = _groups(list(call["params"]), layers * directions, call["has_biases"])
    tokens = _tokens(x)
    macs, flops = 0, 0
    for group in groups:
        step_macs, step_flops = _step_work(kind, tokens, *group)
        macs, flops = macs + step_macs, flops + step_flops
    if call["train"] and call["dropout"] and layers > 1:
        # Applied to the output of every layer but the last: D x P features per token.
        state = groups[0][1].shape[1]
        flops += DROPOUT_FLOPS * (layers - 1) * tokens * directions * state
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


@register_formula(aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)
def rnn_stack(call: OpCall) -> Cost:
    return _stack(call, call.packet, call["input"])


@register_formula(aten.lstm.data, aten.gru.data, aten.rnn_tanh.data, aten.rnn_relu.data)
def rnn_stack_packed(call: OpCall) -> Cost:
    """A packed sequence: ``data`` holds only the real (unpadded) tokens, so each is counted."""
    return _stack(call, call.packet, call["data"])


@register_formula(aten.lstm_cell, aten.gru_cell, aten.rnn_tanh_cell, aten.rnn_relu_cell)
def rnn_cell(call: OpCall) -> Cost:
    kind = call.packet.removesuffix("_cell")
    macs, flops = _step_work(kind, _tokens(call["input"]), call["w_ih"], call["w_hh"],
                             call.get("b_ih"), call.get("b_hh"), None)
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


@register_formula(aten.mkldnn_rnn_layer)
def mkldnn_rnn_layer(call: OpCall) -> Cost:
    """oneDNN's LSTM layer (CPU), one direction: ``weight0..3`` = w_ih, w_hh, b_ih, b_hh."""
    biased = call["has_biases"]
    macs, flops = _step_work(KERNEL_MODES[call["mode"]], _tokens(call["input"]),
                             call["weight0"], call["weight1"],
                             call["weight2"] if biased else None,
                             call["weight3"] if biased else None, None)
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


@register_formula(aten.mkldnn_rnn_layer_backward)
def mkldnn_rnn_layer_backward(call: OpCall) -> Cost:
    """Its backward: oneDNN returns every gradient (input, both weights, biases, h0, c0), so
    all are counted, whichever the model needs."""
    macs, flops = _step_backward(KERNEL_MODES[call["mode"]], _tokens(call["input"]),
                                 call["weight1"], call["weight2"], 2 * bool(call["has_biases"]))
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


@register_formula(aten._cudnn_rnn_backward, aten.miopen_rnn_backward)
def cudnn_rnn_backward(call: OpCall) -> Cost:
    """cuDNN's (MIOpen's) whole stack: ``output_mask`` = (input, hx, cx, weight) gradients.
    The backward-data pass (input and state gradients together) runs unconditionally, since
    the weight pass reads what it leaves in the reserve (aten/src/ATen/native/cudnn/RNN.cpp);
    the weight gradients run when ``output_mask[3]``."""
    mask, kind = call["output_mask"], KERNEL_MODES[call["mode"]]
    biased = call["weight_stride0"] >= 4  # 2 matrices, 2 biases, the projection: 2 to 5
    layers, directions = call["num_layers"], 1 + bool(call["bidirectional"])
    tokens, macs, flops = _tokens(call["input"]), 0, 0
    for w_ih, w_hh, _, _, w_hr in _groups(list(call["weight"]), layers * directions, biased):
        step_macs, step_flops = _step_backward(kind, tokens, w_ih, w_hh, 2 * biased,
                                               weights=mask[3], w_hr=w_hr)
        macs, flops = macs + step_macs, flops + step_flops
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


@register_formula(aten._thnn_fused_lstm_cell, aten._thnn_fused_gru_cell)
def fused_cell(call: OpCall) -> Cost:
    """CUDA's cell kernels: the gate pre-activations come from separate ``mm`` nodes; this is
    the bias adds and the cell's elementwise math on ``input_gates`` (rows x G H)."""
    kind = "lstm" if call.op.overloadpacket is aten._thnn_fused_lstm_cell else "gru"
    gates = call["input_gates"]
    rows, hidden = _tokens(gates), gates.shape[-1] // GATES[kind]
    biases = _numel(call.get("input_bias")) + _numel(call.get("hidden_bias"))
    return call.cost(flops=rows * (biases + CELL_FLOPS[kind] * hidden))


@register_formula(aten._thnn_fused_lstm_cell_backward_impl)
def fused_lstm_cell_backward(call: OpCall) -> Cost:
    """The gates' gradient (B x 4 H) from those of h and c': the LSTM cell's elementwise
    backward (`CELL_BACKWARD_FLOPS`, whose add of c''s two gradients is made only when
    ``grad_cy`` is given) and one bias gradient summed over the rows (both biases get it)."""
    cx = call["cx"]
    rows, hidden = _tokens(cx), cx.shape[-1]
    cell = CELL_BACKWARD_FLOPS["lstm"] - (call.get("grad_cy") is None)
    return call.cost(flops=rows * (cell * hidden + call["has_bias"] * GATES["lstm"] * hidden))


@register_formula(aten._thnn_fused_gru_cell_backward)
def fused_gru_cell_backward(call: OpCall) -> Cost:
    """The gradients of both gate pre-activations from that of h': the GRU cell's elementwise
    backward, and with biases each bias gradient summed over the rows (3 H each)."""
    grad = call["grad_hy"]
    rows, hidden = _tokens(grad), grad.shape[-1]
    biases = 2 * GATES["gru"] * hidden * call["has_bias"]
    return call.cost(flops=rows * (CELL_BACKWARD_FLOPS["gru"] * hidden + biases))
