"""Loss kernels autograd dispatches that have no decomposition at dynamic sizes.

``nll_loss_backward`` (cross entropy's gradient through its log-softmax) writes a gradient that
is zero except at each sample's target class, where it is the incoming gradient negated and
scaled: by the class weight when one is given, and by 1 / total weight for a mean. Its count is
per target, not per class: 2 FLOPs (the scale, the division), whatever the number of classes.
"""

from __future__ import annotations

from .registry import Cost, OpCall, aten, register_formula

#: Per target: times its class weight (or 1), divided by the total weight (or 1).
NLL_GRADIENT_FLOPS = 2


@register_formula(aten.nll_loss_backward, aten.nll_loss2d_backward)
def nll_loss_backward(call: OpCall) -> Cost:
    return call.cost(flops=NLL_GRADIENT_FLOPS * call["target"].numel)
