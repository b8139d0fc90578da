"""Convolutions, plain, grouped, depthwise and transposed, 1d/2d/3d.

Each output position of a plain convolution is an inner product over the weight's
``C_in/groups x kernel`` entries (padding positions included, as cuDNN computes them and as
torch.utils.flop_counter and torchvision count). A transposed convolution scatters every *input*
position through the same number of weights.
"""

from __future__ import annotations

import math


from .matmul import contraction
from .registry import Cost, OpCall, register_formula, aten


def _convolution_cost(call: OpCall, transposed: bool) -> Cost:
    # cudnn, mkldnn and the slow kernels name their input "self"; the others "input".
    x, weight = call.get("input", call.get("self")), call["weight"]
    # weight: (C_out, C_in/groups, *kernel) plain; (C_in, C_out/groups, *kernel) transposed.
    weights_per_position = math.prod(weight.shape[1:])
    positions = x.numel if transposed else call.out.numel
    bias = call.out.numel if call.get("bias") is not None else 0
    return contraction(call, positions * weights_per_position, bias_elements=bias)


@register_formula(aten.convolution, aten._convolution, aten.convolution_overrideable)
def convolution(call: OpCall) -> Cost:
    return _convolution_cost(call, transposed=bool(call["transposed"]))


@register_formula(aten.conv1d, aten.conv2d, aten.conv3d, aten.cudnn_convolution,
                  aten._slow_conv2d_forward, aten.mkldnn_convolution)
def conv(call: OpCall) -> Cost:
    return _convolution_cost(call, transposed=False)


@register_formula(aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d,
                  aten.cudnn_convolution_transpose)
def conv_transpose(call: OpCall) -> Cost:
    return _convolution_cost(call, transposed=True)
