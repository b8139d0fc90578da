"""Backward kernels: the ops autograd dispatches for the gradients of the forward families.

Contractions (``mm``, ``bmm``, convolutions as ``convolution_backward``) keep the forward's
convention, 2 FLOPs per MAC. Attention kernels count the four gradient contractions
(dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q): twice the forward MACs, the model-FLOPs
convention of PaLM's appendix B. Fused flash kernels also recompute q . k from the saved
log-sum-exp; that recompute is hardware work, not counted here (torch.utils.flop_counter counts
it: 5 contractions where this counts 4). Elementwise gradients are FLOPs per element with their
composition in the comment, in the forward's convention (a transcendental is 1).
"""

from __future__ import annotations

import math

import torch

from .attention import (
    _nonzero, attention_dims, causal_masked_scores, flex_dims, kernel_is_causal,
)
from .embedding import MAX, MEAN
from .interpolate import NEIGHBOURS, antialiased_weights
from .matmul import contraction
from .pointwise import per_output_element
from .registry import FLOPS_PER_MAC, FORMULAS, Cost, OpCall, register_formula, aten


#: FLOPs per gradient element: the local derivative (from the saved input or output) times the
#: incoming gradient.
ACTIVATION_BACKWARD_FLOPS: dict[str, int] = {
    "threshold_backward": 1,  # select the gradient where the input passed the threshold (relu)
    "hardtanh_backward": 1,  # select inside the bounds
    "leaky_relu_backward": 2,  # select the slope, multiply
    "gelu_backward": 2,  # derivative (1), times the gradient (1)
    "silu_backward": 2,
    "mish_backward": 2,
    "elu_backward": 2,
    "softplus_backward": 2,
    "hardswish_backward": 2,
    "hardsigmoid_backward": 2,
    "log_sigmoid_backward": 2,
    "sigmoid_backward": 3,  # y * (1 - y): subtract, multiply; times the gradient
    "tanh_backward": 3,  # 1 - y^2: square, subtract; times the gradient
    "native_dropout_backward": 2,  # gradient times the keep mask, times the scale
    "softshrink_backward": 1,  # select the gradient outside [-lambda, lambda]
    "hardshrink_backward": 1,
}
#: softmax: dx = y * (g - sum(g * y)): multiply, sum, subtract, multiply. log_softmax:
#: dx = g - exp(y) * sum(g): sum, exp, multiply, subtract.
SOFTMAX_BACKWARD_FLOPS = 4
#: Per normalized element: recompute x_hat = (x - mean) * rstd (2); input gradient
#: rstd * (g - mean(g) - x_hat * mean(g * x_hat)) (multiply, two sums, multiply, two subtracts,
#: scale = 6, one more when a weight scales g first); weight gradient sum(g * x_hat) (2);
#: bias gradient sum(g) (1).
NORM_X_HAT_FLOPS = 2
NORM_INPUT_GRAD_FLOPS = 6
NORM_WEIGHT_GRAD_FLOPS = 2
NORM_BIAS_GRAD_FLOPS = 1
#: Batch norm in eval mode: the statistics are constants, dx = g * weight * invstd.
FROZEN_STATS_INPUT_GRAD_FLOPS = 2


def _register_activations() -> None:
    # getattr, not hasattr: a misspelt name fails at import instead of leaving the op uncounted.
    for name, flops in ACTIVATION_BACKWARD_FLOPS.items():
        register_formula(getattr(aten, name))(per_output_element(flops))


_register_activations()


@register_formula(aten._softmax_backward_data, aten._log_softmax_backward_data)
def softmax_backward(call: OpCall) -> Cost:
    return call.cost(flops=SOFTMAX_BACKWARD_FLOPS * call["grad_output"].numel)


def _norm_backward(call: OpCall, x_elements, output_mask, *, weighted: bool,
                   frozen_stats: bool = False) -> Cost:
    input_grad, weight_grad, bias_grad = output_mask
    if frozen_stats:
        per_element = FROZEN_STATS_INPUT_GRAD_FLOPS * input_grad
    else:
        per_element = (NORM_X_HAT_FLOPS * (input_grad or weight_grad)
                       + (NORM_INPUT_GRAD_FLOPS + weighted) * input_grad)
    per_element += NORM_WEIGHT_GRAD_FLOPS * weight_grad + NORM_BIAS_GRAD_FLOPS * bias_grad
    return call.cost(flops=per_element * x_elements)


@register_formula(aten.native_layer_norm_backward, aten.native_group_norm_backward)
def layer_or_group_norm_backward(call: OpCall) -> Cost:
    """Layer and group norm differ only in which elements share a mean: the same work per
    normalized element."""
    return _norm_backward(call, call["input"].numel, call["output_mask"],
                          weighted=call.get("weight") is not None)


@register_formula(aten.native_batch_norm_backward, aten.cudnn_batch_norm_backward,
                  aten.miopen_batch_norm_backward)
def batch_norm_backward(call: OpCall) -> Cost:
    mask = call.get("output_mask", (True, True, True))
    training = call.get("train", call.get("training", True))
    return _norm_backward(call, call["input"].numel, mask,
                          weighted=call.get("weight") is not None, frozen_stats=not training)


@register_formula(aten.embedding_dense_backward)
def embedding_backward(call: OpCall) -> Cost:
    # Each gradient row is added into the weight row its index picked: one add per element.
    return call.cost(flops=call["grad_output"].numel)


@register_formula(aten._embedding_bag_backward, aten._embedding_bag_dense_backward)
def embedding_bag_backward(call: OpCall) -> Cost:
    # Each bag's gradient row is added into the weight row of each index in the bag; scaled
    # first by the index's per-sample weight, or divided by the bag's size for a mean. A max
    # bag adds its gradient into the one row each column's max came from.
    if call["mode"] == MAX:
        return call.cost(flops=call["grad"].numel)
    gathered = call["indices"].numel * call["grad"].shape[-1]
    scaled = call.get("per_sample_weights") is not None or call["mode"] == MEAN
    return call.cost(flops=gathered * (2 if scaled else 1))


@register_formula(aten._weight_norm_interface_backward)
def weight_norm_backward(call: OpCall) -> Cost:
    """w = g v / |v| per slice of ``dim``, as ATen's kernel differentiates it: the gain's
    gradient sum(grad_w v) / |v| (a multiply and an add per element, a divide per norm), the
    direction's a (grad_w - v b) with a = g / |v| and b = a grad_g / |v| (a multiply, a
    subtract and a multiply per element; two divides and a multiply per norm)."""
    return call.cost(flops=5 * call["saved_v"].numel + 4 * call["saved_norms"].numel)


#: FLOPs of the p-norm's derivative per pair and feature, as ATen's Distance kernels write
#: each ``*dist_calc::backward``: p = 1 ``grad * sign(diff)``; p = 2 ``grad * diff / dist``;
#: p < 2 ``sign(diff) * |diff|^(p-1) * grad / dist^(p-1)``; any other finite p
#: ``diff * |diff|^(p-2) * grad / dist^(p-1)``; p = inf
#: ``grad * sign(diff) * (1 - min(1, ceil(||diff| - dist|)))``.
_CDIST_DERIVATIVE = {1.0: 2, 2.0: 2, "below 2": 7, "other": 6, math.inf: 9}


def _distance_backward(call: OpCall, pairs, features, accumulations: int) -> Cost:
    """Per pair and feature: the difference, the p-norm's derivative (`_CDIST_DERIVATIVE`) and
    ``accumulations`` adds into the rows. p = 0 has no gradient: ATen fills it with zeros."""
    p = call["p"]
    if p == 0:
        return call.cost()
    kind = p if p in _CDIST_DERIVATIVE else ("below 2" if p < 2 else "other")
    derivative = _CDIST_DERIVATIVE[kind]
    return call.cost(flops=pairs * features * (1 + accumulations + derivative))


@register_formula(aten._cdist_backward)
def cdist_backward(call: OpCall) -> Cost:
    """The gradient of x1 (autograd calls it again with x1 and x2 swapped for x2's), added into
    x1's row."""
    return _distance_backward(call, call["cdist"].numel, call["x1"].shape[-1], 1)


@register_formula(aten._pdist_backward)
def pdist_backward(call: OpCall) -> Cost:
    """Over the N(N-1)/2 pairs of rows of one input (``pdist``), ATen adding each pair's
    gradient into one row and subtracting it from the other."""
    return _distance_backward(call, call["pdist"].numel, call["self"].shape[-1], 2)


@register_formula(aten.multi_margin_loss_backward)
def multi_margin_loss_backward(call: OpCall) -> Cost:
    """ATen's kernel, per sample and class: the margin z = margin - x[target] + x[d] (2), for
    p = 2 the gradient 2 g z (2; p = 1 takes g as it is), times the target's weight (1, given
    one), accumulated into the target's gradient (1), then scaled by the output's gradient (1).
    Counted for every class, as the forward's decomposition counts every margin: the kernel
    skips a class whose margin is not positive, which the values decide."""
    per_element = 4 + 2 * (call["p"] == 2) + (call.get("weight") is not None)
    return call.cost(flops=per_element * call["self"].numel)


@register_formula(aten.multilabel_margin_loss_backward)
def multilabel_margin_loss_backward(call: OpCall) -> Cost:
    """ATen's kernel, per sample of C classes: each target (up to C, the list ended by -1)
    against each class: the margin z = 1 - x[target] + x[d] (2) and, where positive, the
    gradient added to the class and subtracted from the target (2); then every element scaled
    by the output's gradient (1). Counted for all C^2 (target slot, class) pairs, as the
    forward's decomposition counts: the kernel's pairs depend on the target values."""
    x = call["self"]
    return call.cost(flops=x.numel * (4 * x.shape[-1] + 1))


@register_formula(aten._segment_reduce_backward)
def segment_reduce_backward(call: OpCall) -> Cost:
    """Each segment's gradient spread over the elements it reduced: one FLOP per element of
    ``data`` (sum's copy counted as max's compare and mean's divide are)."""
    return call.cost(flops=call["data"].numel)


@register_formula(aten._embedding_bag_per_sample_weights_backward)
def embedding_bag_per_sample_weights_backward(call: OpCall) -> Cost:
    """The gradient of each per-sample weight: its bag's output gradient dotted with the row
    it scaled, one MAC per element of the row."""
    return contraction(call, call["indices"].numel * call["weight"].shape[-1])


@register_formula(aten.logit_backward)
def logit_backward(call: OpCall) -> Cost:
    """ATen's kernel per element: x checked against [eps, 1 - eps] (2 compares), then
    grad / (x (1 - x)) (a subtract, a multiply, a divide)."""
    return call.cost(flops=5 * call.out.numel)


#: FLOPs per sampled point and channel of the grid sampler's backward, (input gradient, grid
#: gradient), by (spatial dims, interpolation_mode), as ATen's GridSampler kernels compute them.
#: The input gradient adds the point's gradient times each corner's weight into that corner:
#: 2 per corner (bicubic's weight, a product of two coefficients, 3 per tap). The grid gradient
#: adds, per corner and coordinate, the corner's value times the weight's derivative (the other
#: coordinates' distances) times the gradient: bilinear's ``gix -= nw_val * (iy_se - iy) *
#: gOut`` is 3, trilinear's 4, bicubic's ``val * x_coeffs_grad[i] * y_coeffs[j] * gOut`` 4.
#: Nearest adds the gradient into the one input it took and has no grid gradient.
_GRID_SAMPLER_BACKWARD = {
    (2, 0): (4 * 2, 4 * 2 * 3),  # bilinear: 4 corners
    (3, 0): (8 * 2, 8 * 3 * 4),  # trilinear: 8 corners
    (2, 1): (1, 0), (3, 1): (1, 0),  # nearest
    (2, 2): (16 * 3, 16 * 2 * 4),  # bicubic: 16 taps
}


@register_formula(aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward)
def grid_sampler_backward(call: OpCall) -> Cost:
    # ATen reads output_mask[0] only: the grid's gradient is always computed.
    grad = call["grad_output"]
    input_grad, grid_grad = _GRID_SAMPLER_BACKWARD[(grad.ndim - 2, call["interpolation_mode"])]
    wanted_input = call["output_mask"][0]
    return call.cost(flops=grad.numel * (input_grad * wanted_input + grid_grad))


@register_formula(aten.convolution_backward)
def convolution_backward(call: OpCall) -> Cost:
    """The input gradient is a transposed convolution, the weight gradient a correlation of
    input and gradient: each has the forward's MACs. The bias gradient sums the gradient."""
    grad, x, weight = call["grad_output"], call["input"], call["weight"]
    input_grad, weight_grad, bias_grad = call["output_mask"]
    positions = x.numel if call["transposed"] else grad.numel
    forward_macs = positions * math.prod(weight.shape[1:])
    return contraction(call, forward_macs * (input_grad + weight_grad),
                       bias_elements=grad.numel if bias_grad else 0)


def _attention_backward(heads, q_len, kv_len, qk_dim, v_dim, *, causal: bool, dropout,
                        skipped_scores=0) -> Cost:
    """Per (query, key) pair: the four gradient contractions, the softmax gradient, the scale
    and, with dropout, the mask; pairs a causal mask discards, or the ``skipped_scores`` of a
    block-sparse kernel, are also ``masked_*``."""
    scores = heads * q_len * kv_len
    masked_scores = causal_masked_scores(heads, q_len, kv_len) if causal else skipped_scores
    macs_per_score = 2 * (qk_dim + v_dim)
    flops_per_score = (FLOPS_PER_MAC * macs_per_score + SOFTMAX_BACKWARD_FLOPS + 1
                       + (2 if _nonzero(dropout) else 0))
    return Cost(flops=scores * flops_per_score, macs=scores * macs_per_score,
                masked_flops=masked_scores * flops_per_score,
                masked_macs=masked_scores * macs_per_score)


def _bhld_backward(call: OpCall) -> Cost:
    return _attention_backward(*attention_dims(call), causal=bool(call.get("is_causal")),
                               dropout=call.get("dropout_p")) + call.cost()


register_formula(
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
    aten._scaled_dot_product_fused_attention_overrideable_backward,
)(_bhld_backward)


@register_formula(aten._flash_attention_backward, aten._efficient_attention_backward)
def attention_kernel_backward(call: OpCall) -> Cost:
    """The CUDA kernels take (batch, seq, heads, dim)."""
    return _attention_backward(*attention_dims(call, heads_first=False),
                               causal=kernel_is_causal(call),
                               dropout=call.get("dropout_p")) + call.cost()


@register_formula(torch.ops.higher_order.flex_attention_backward)
def flex_attention_backward(call: OpCall) -> Cost:
    """FlexAttention's backward kernel (``flex_attention_backward``, which autograd runs for
    ``flex_attention``; its arguments in that order: query, key, value, out, logsumexp,
    grad_out, ...), counted as SDPA's, four contractions per score (torch's FlopCounterMode
    counts five: ``sdpa_backward_flop_count`` adds the recomputed q.k), with the blocks its
    block mask skips also ``masked_*`` (``skipped_pairs``, carried over from the forward call).
    The ``score_mod``'s gradient ops are traced on their own, per score."""
    return _attention_backward(*flex_dims(call), causal=False, dropout=0,
                               skipped_scores=call.get("skipped_pairs") or 0) + call.cost()


@register_formula("flex_lib::zeros_and_scatter")
def zeros_and_scatter(call: OpCall) -> Cost:
    """The gradient of an index inside a flex attention ``score_mod`` (``ModIndex``'s backward):
    each value added into the element it was read from, 1 FLOP per value."""
    return call.cost(flops=call["vals"].numel)


@register_formula(
    aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward,
    aten.fractional_max_pool2d_backward, aten.fractional_max_pool3d_backward,
    aten.adaptive_max_pool2d_backward, aten.adaptive_max_pool3d_backward,
    *(getattr(aten, f"{resize}{d}d_backward") for d in (1, 2, 3)
      for resize in ("upsample_nearest", "_upsample_nearest_exact")),
    *(getattr(aten, f"{pad}_pad{d}d_backward") for d in (1, 2, 3)
      for pad in ("reflection", "replication")),
)
def added_where_it_came_from(call: OpCall) -> Cost:
    # Each gradient element is added at the input position the forward took it from: the max
    # its index saved, the pixel a nearest resize repeated, the edge a pad mirrored or copied.
    return call.cost(flops=call["grad_output"].numel)


@register_formula(*(getattr(aten, f"{resize}_backward") for resize in NEIGHBOURS))
def resize_backward(call: OpCall) -> Cost:
    # Each gradient element, times the weight of each neighbour it was blended from, is added
    # into that neighbour: a multiply and an add per neighbour.
    neighbours = NEIGHBOURS[call.packet.removesuffix("_backward")]
    return call.cost(flops=2 * neighbours * call["grad_output"].numel)


@register_formula(aten._upsample_bilinear2d_aa_backward, aten._upsample_bicubic2d_aa_backward,
                  aten._upsample_lanczos2d_aa_backward)
def antialiased_resize_backward(call: OpCall) -> Cost:
    # The forward's weights again, each times its output's gradient and added into its input
    # pixel: a multiply and an add per weight.
    weights = antialiased_weights(call, call["input_size"], call["output_size"],
                                  (call.get("scales_h"), call.get("scales_w")))
    return call.cost(flops=2 * weights)


@register_formula(aten.avg_pool2d_backward, aten.avg_pool3d_backward)
def avg_pool_backward(call: OpCall) -> Cost:
    # Each gradient element, divided by the window size, is added at every window position.
    window = math.prod(call["kernel_size"]) if call["kernel_size"] else 1
    return call.cost(flops=call["grad_output"].numel * (1 + window))


@register_formula(aten._adaptive_avg_pool2d_backward, aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool_backward(call: OpCall) -> Cost:
    # Each input position gathers the gradients of the windows covering it, divided by their size.
    return call.cost(flops=2 * call.out.numel)


FORMULAS.register_zero(
    [aten.select_backward, aten.slice_backward, aten.diagonal_backward],
    "the gradient of a view: the incoming gradient copied into zeros of the input's shape",
    moves="copy",
)
