"""Interpolation (upsampling): FLOPs per output element from the neighbours it blends.

Linear interpolation over ``d`` dims blends ``2**d`` neighbours: ``2**d`` multiplies and
``2**d - 1`` adds. Bicubic blends 16: 16 multiplies and 15 adds. Nearest copies: 0 FLOPs.
"""

from __future__ import annotations

import torch

from .registry import Cost, OpCall, register_formula

aten = torch.ops.aten


def _blend(neighbours: int):
    def interpolate(call: OpCall) -> Cost:
        return call.cost(flops=(2 * neighbours - 1) * call.out.numel)

    interpolate.__qualname__ = f"interpolate[{neighbours} neighbours]"
    return interpolate


register_formula(aten.upsample_linear1d)(_blend(2))
register_formula(aten.upsample_bilinear2d)(_blend(4))
register_formula(aten.upsample_trilinear3d)(_blend(8))
register_formula(aten.upsample_bicubic2d)(_blend(16))
