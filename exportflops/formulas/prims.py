"""torch's primitives (``torch._prims``), which some of torch's decompositions lower to
(``i0``'s, ``erfcx``'s): each counted as its aten namesake is. A graph holds no prims; an op
with no formula of its own is counted through its decomposition, whose prims these count.
(Inductor's own prims, which torch.compile registers for its lowering, reach no graph here.)"""

from __future__ import annotations

import torch

from .pointwise import FLOPS_PER_OUTPUT_ELEMENT, per_output_element
from .reduce import reduction
from .registry import FORMULAS, Cost, OpCall, register_formula
from .spectral import fft_c2c, fft_c2r, fft_r2c

prims = torch.ops.prims


def _prims(*names: str) -> list:
    return [getattr(prims, name) for name in names]


#: Pointwise prims named as aten's ops are, or as their aten counterparts (``erf_inv``).
_POINTWISE = {name: flops for name, flops in FLOPS_PER_OUTPUT_ELEMENT.items()
              if hasattr(prims, name)} | {
    "erf_inv": 1, "cbrt": 1, "signbit": 1, "nextafter": 1, "frexp": 1, "gcd": 1,
    "shift_left": 1, "shift_right_arithmetic": 1}
for _name, _flops in _POINTWISE.items():
    register_formula(getattr(prims, _name))(per_output_element(_flops))

register_formula(*_prims("sum", "prod", "amax", "amin", "xor_sum"))(reduction)
register_formula(prims.fft_c2c)(fft_c2c)
register_formula(prims.fft_r2c)(fft_r2c)
register_formula(prims.fft_c2r)(fft_c2r)


@register_formula(prims.var)
def variance(call: OpCall) -> Cost:
    """As aten's var: the mean, subtract, square and sum per element read, a divide per
    output."""
    return call.cost(flops=4 * call["inp"].numel + call.out.numel)


FORMULAS.register_zero(
    _prims("broadcast_in_dim", "collapse_view", "view_of", "view_of_dtype", "squeeze",
           "transpose", "split_dim", "as_strided", "conj", "real", "imag", "item",
           "maximum_value", "minimum_value", "_make_token", "_sink_tokens"),
    "view or metadata: aliases its input, reads no tensor data",
    moves="nothing",
)
FORMULAS.register_zero(
    _prims("clone", "cat", "copy_strided", "copy_to", "rev", "convert_element_type",
           "collapse", "reshape", "as_strided_scatter", "device_put", "resize",
           "conj_physical"),
    "data movement: copies, gathers or rearranges elements without arithmetic",
    moves="copy",
)
FORMULAS.register_zero(
    _prims("empty", "empty_permuted", "empty_strided", "full", "full_like", "iota",
           "scalar_tensor", "fill", "normal", "uniform"),
    "creation: fills a new tensor, reads no tensor data",
    moves="write",
)
FORMULAS.register_value_dependent(
    _prims("svd"),
    "is iterative: the solver sweeps until the values converge, so its work depends on the "
    "matrix, not only on its shape",
)
