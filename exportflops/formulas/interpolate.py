"""Interpolation (upsampling): FLOPs per output element from the neighbours it blends.

Linear interpolation over ``d`` dims blends ``2**d`` neighbours: ``2**d`` multiplies and
``2**d - 1`` adds. Bicubic blends 16: 16 multiplies and 15 adds. Nearest copies: 0 FLOPs.
"""

from __future__ import annotations

import math


from .registry import Cost, OpCall, Size, register_formula, aten


#: Input positions each output element of a resize blends: ``2**d`` for linear over ``d`` dims,
#: 16 for bicubic.
NEIGHBOURS = {"upsample_linear1d": 2, "upsample_bilinear2d": 4, "upsample_trilinear3d": 8,
              "upsample_bicubic2d": 16}


def _blend(neighbours: int):
    def interpolate(call: OpCall) -> Cost:
        return call.cost(flops=(2 * neighbours - 1) * call.out.numel)

    interpolate.__qualname__ = f"interpolate[{neighbours} neighbours]"
    return interpolate


for _name, _neighbours in NEIGHBOURS.items():
    register_formula(getattr(aten, _name))(_blend(_neighbours))


#: Taps of each antialiased filter at scale 1 (torch's interp_size: 2 for linear, 4 for cubic,
#: 6 for Lanczos-3).
_AA_TAPS = {"_upsample_bilinear2d_aa": 2, "_upsample_bicubic2d_aa": 4,
            "_upsample_lanczos2d_aa": 6}


@register_formula(aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa,
                  aten._upsample_lanczos2d_aa)
def antialiased(call: OpCall) -> Cost:
    """An antialiased resize blends, per output pixel, every input pixel under the filter; when
    shrinking by ``s`` the filter widens by ``s`` (PyTorch's ``_compute_index_ranges_weights``:
    support = taps / 2 x scale; the window of output ``i`` spans the inputs between
    ``scale (i + 0.5) -/+ support``, clipped to the image). Per output pixel, ``k`` taps are
    ``k`` multiplies and ``k - 1`` adds, ``k`` the product of the two dims' windows."""
    scales = call.get("scale_factors") or (call.get("scales_h"), call.get("scales_w"))
    # The .vec overload names its tensor input, .default self.
    x = call.get("input", call.get("self"))
    weights = antialiased_weights(call, x.shape, call.out.shape, scales)
    return call.cost(flops=2 * weights - call.out.numel)


def antialiased_weights(call: OpCall, size_in: tuple, size_out: tuple, scales) -> Size:
    """The weights an antialiased resize of ``size_in`` (N, C, H, W) to ``size_out`` (its last
    two are H and W) applies: per plane, each output pixel's row window times its column
    window."""
    taps = _AA_TAPS[call.packet.removesuffix("_backward")]
    windows = [_window_sum(size_in[d], size_out[d], taps, bool(call["align_corners"]), scale)
               for d, scale in zip((-2, -1), scales)]
    return math.prod(size_in[:-2]) * windows[0] * windows[1]


def _window_sum(size_in: int, size_out: int, taps: int, align_corners: bool,
                scale_factor: float | None) -> int:
    """The input pixels every output position of one dim reads, summed over the positions."""
    if not isinstance(size_in, int) or not isinstance(size_out, int):
        raise ValueError(f"an antialiased resize is counted at fixed sizes only (its windows "
                         f"depend on the sizes' ratio), and it resizes {size_in} to {size_out}: "
                         f"analyze it without dynamic image sizes, or, where a size is read "
                         f"from a tensor's values (a u symbol: SigLIP 2's spatial_shapes), "
                         f"with those sizes fixed in the model")
    if align_corners:
        scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        scale = 1 / scale_factor if scale_factor else size_in / size_out
    support = taps / 2 * scale if scale >= 1.0 else taps / 2
    total = 0
    for i in range(size_out):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        total += min(int(center + support + 0.5), size_in) - low
    return total


#: ``grid_sample``'s ``padding_mode`` (0 zeros, 1 border, 2 reflection) -> FLOPs per grid
#: coordinate, as ATen's ``grid_sampler_compute_source_index`` adds them to the unnormalizing:
#: border clips (1); reflection reflects (subtract, abs, fmod, divide, floor, parity test and
#: the flip, 7) and clips (1).
_PADDING_FLOPS = {0: 0, 1: 1, 2: 8}
#: FLOPs per grid coordinate to unnormalize it to the input's size: an add, a multiply and a
#: subtract (``((coord + 1) * size - 1) / 2`` folds its divide into the multiply's constant).
_UNNORMALIZE_FLOPS = 3
#: Per output point of a trilinear sample: the corner below each coordinate (a floor each, 3),
#: the distances to the two corners in each dim (6), and each of the 8 corner weights, a product
#: of 3 distances (2 multiplies each, 16).
_TRILINEAR_WEIGHT_FLOPS = 3 + 6 + 8 * 2
#: ``interpolation_mode`` 0: bilinear (trilinear on volumes); 1 nearest (bicubic is 2-D only).
_BILINEAR = 0


@register_formula(aten.grid_sampler_3d)
def grid_sampler_3d(call: OpCall) -> Cost:
    """``grid_sample`` on volumes (N, C, D, H, W), as ATen's kernel runs it: per output point,
    its 3 grid coordinates unnormalized and padded, then trilinear's corner weights (or a round
    per coordinate for nearest); per output element, the 8 corners blended (15, as a trilinear
    resize) or, for nearest, one copied. (The 2-D sampler is counted through its decomposition.)"""
    out = call.out
    points = out.shape[0] * math.prod(out.shape[2:])
    per_coordinate = _UNNORMALIZE_FLOPS + _PADDING_FLOPS[call["padding_mode"]]
    if call["interpolation_mode"] == _BILINEAR:
        per_point, blend = 3 * per_coordinate + _TRILINEAR_WEIGHT_FLOPS, 2 * 8 - 1
    else:
        per_point, blend = 3 * (per_coordinate + 1), 0
    return call.cost(flops=points * per_point + blend * out.numel)
