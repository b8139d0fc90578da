"""torch's primitives (``torch._prims``), which some of torch's decompositions lower to
(``i0``'s, ``erfcx``'s): each counted as its aten namesake is. A graph holds no prims; an op
with no formula of its own is counted through its decomposition, whose prims these count.
(Inductor's own prims, which torch.compile registers for its lowering, reach no graph here.)"""

from __future__ import annotations

import torch

from .linalg import ITERATIVE
from .pointwise import FLOPS_PER_OUTPUT_ELEMENT, per_output_element
from .reduce import reduction, variance
from .registry import FORMULAS, register_formula
from .spectral import fft_c2c, fft_c2r, fft_r2c
from .zero import COPY, CREATION, VIEW

prims = torch.ops.prims


def _prims(*names: str) -> list:
    return [getattr(prims, name) for name in names]


#: Pointwise prims named as aten's ops are, or as their aten counterparts (``erf_inv``), and
#: the special functions ``torch.special`` and ``i0`` lower to (``special_log_ndtr`` is erfcx
#: with a few more ops, counted through its decomposition): one operation each.
_POINTWISE = {name: flops for name, flops in FLOPS_PER_OUTPUT_ELEMENT.items()
              if hasattr(prims, name)} | dict.fromkeys((
    "erf_inv", "cbrt", "signbit", "nextafter", "frexp", "gcd", "shift_left",
    "shift_right_arithmetic", "bessel_i0", "bessel_i0e", "bessel_i1", "bessel_i1e",
    "bessel_j0", "bessel_j1", "spherical_bessel_j0", "erfcx", "ndtri", "zeta", "igamma",
    "igammac"), 1)
for _name, _flops in _POINTWISE.items():
    register_formula(getattr(prims, _name))(per_output_element(_flops))

register_formula(*_prims("sum", "prod", "amax", "amin", "xor_sum"))(reduction)
register_formula(prims.fft_c2c)(fft_c2c)
register_formula(prims.fft_r2c)(fft_r2c)
register_formula(prims.fft_c2r)(fft_c2r)
register_formula(prims.var)(variance)

FORMULAS.register_zero(
    _prims("broadcast_in_dim", "collapse_view", "view_of", "view_of_dtype", "squeeze",
           "transpose", "split_dim", "as_strided", "conj", "real", "imag", "item",
           "maximum_value", "minimum_value", "_make_token", "_sink_tokens"),
    VIEW, moves="nothing",
)
FORMULAS.register_zero(
    _prims("clone", "cat", "copy_strided", "copy_to", "rev", "convert_element_type",
           "collapse", "reshape", "as_strided_scatter", "device_put", "resize",
           "conj_physical"),
    COPY, moves="copy",
)
FORMULAS.register_zero(
    _prims("empty", "empty_permuted", "empty_strided", "full", "full_like", "iota",
           "scalar_tensor", "fill", "normal", "uniform"),
    CREATION, moves="write",
)
FORMULAS.register_value_dependent(_prims("svd"), ITERATIVE)
