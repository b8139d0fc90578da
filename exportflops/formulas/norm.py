"""Normalization: layer, RMS, group, instance and batch norm, FLOPs per element normalized.

Statistics: mean (1 add), subtract the mean (1), square (1), sum (1), multiply by the reciprocal
standard deviation (1) = ``STATS_FLOPS`` per element; the per-row ``rsqrt(var + eps)`` is
negligible and not counted. An affine weight adds 1 per element, a bias 1 more.
"""

from __future__ import annotations


from .registry import Cost, OpCall, register_formula, aten


STATS_FLOPS = 5
#: Normalizing with stored statistics: subtract the running mean (1), multiply by rstd (1).
RUNNING_STATS_FLOPS = 2
#: RMS norm: square (1), sum (1), multiply by the reciprocal root-mean-square (1).
RMS_FLOPS = 3


def _affine(call: OpCall) -> int:
    return (call.get("weight") is not None) + (call.get("bias") is not None)


def normalized(call: OpCall, flops_per_element) -> Cost:
    x = call.get("input", call.get("self"))
    return call.cost(flops=(flops_per_element + _affine(call)) * x.numel)


@register_formula(aten.layer_norm, aten.native_layer_norm, aten.group_norm,
                  aten.native_group_norm)
def layer_norm(call: OpCall) -> Cost:
    return normalized(call, STATS_FLOPS)


@register_formula(aten.rms_norm, aten._fused_rms_norm)
def rms_norm(call: OpCall) -> Cost:
    return normalized(call, RMS_FLOPS)


@register_formula(aten.batch_norm, aten.native_batch_norm, aten._native_batch_norm_legit,
                  aten._native_batch_norm_legit_functional, aten.cudnn_batch_norm,
                  aten.miopen_batch_norm)
def batch_norm(call: OpCall) -> Cost:
    # training=True computes batch statistics; eval normalizes with the running ones.
    return normalized(call, STATS_FLOPS if call["training"] else RUNNING_STATS_FLOPS)


@register_formula(aten._native_batch_norm_legit_no_training, aten._batch_norm_no_update)
def batch_norm_eval(call: OpCall) -> Cost:
    return normalized(call, RUNNING_STATS_FLOPS)


@register_formula(aten._batch_norm_with_update, aten._batch_norm_with_update_functional)
def batch_norm_train(call: OpCall) -> Cost:
    return normalized(call, STATS_FLOPS)


@register_formula(aten.instance_norm)
def instance_norm(call: OpCall) -> Cost:
    return normalized(call, STATS_FLOPS if call["use_input_stats"] else RUNNING_STATS_FLOPS)
