"""Elementwise ops: FLOPs per *output* element, one table line per op.

The convention is 1 FLOP per output element: transcendental functions (exp, tanh, erf), compares
and activations count as one operation, as fvcore, DeepSpeed and torchinfo count them. The few
entries above 1 are compositions of such operations, named in their comment.
"""

from __future__ import annotations


from .registry import FORMULAS, Cost, OpCall, aten_ops, register_formula, aten


FLOPS_PER_OUTPUT_ELEMENT: dict[str, int] = {
    # arithmetic
    "add": 1, "sub": 1, "rsub": 1, "mul": 1, "div": 1, "neg": 1, "abs": 1, "reciprocal": 1,
    "square": 1, "pow": 1, "sqrt": 1, "rsqrt": 1, "remainder": 1, "fmod": 1, "floor_divide": 1,
    "sign": 1, "sgn": 1, "angle": 1, "floor": 1, "ceil": 1, "round": 1, "trunc": 1,
    "frac": 1,
    "maximum": 1, "minimum": 1, "fmax": 1, "fmin": 1, "copysign": 1, "hypot": 1,
    "_add_relu": 2,  # add, then relu (the mobile optimizer's fusion)
    "addcmul": 2,  # multiply, add
    "addcdiv": 2,  # divide, add
    "lerp": 3,  # subtract, multiply, add
    "xlogy": 2,  # log, multiply
    # transcendental
    "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1,
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "atan2": 1,
    "sinh": 1, "cosh": 1, "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1,
    "erf": 1, "erfc": 1, "erfinv": 1, "sigmoid": 1, "logit": 1, "lgamma": 1, "digamma": 1,
    "polygamma": 1,  # digamma's derivatives: its backward
    # activations
    "relu": 1, "relu6": 1, "gelu": 1, "silu": 1, "mish": 1, "elu": 1, "selu": 1, "celu": 1,
    "leaky_relu": 1, "hardtanh": 1, "hardswish": 1, "hardsigmoid": 1, "softplus": 1,
    "softshrink": 1, "hardshrink": 1, "threshold": 1, "prelu": 1, "_prelu_kernel": 1,
    "rrelu": 1, "rrelu_with_noise": 1, "rrelu_with_noise_functional": 1, "log_sigmoid": 1,
    "log_sigmoid_forward": 1,
    "glu": 2,  # sigmoid of one half, multiply by the other; per output element
    # compares, logic, selection and clamping
    "eq": 1, "ne": 1, "lt": 1, "le": 1, "gt": 1, "ge": 1, "isnan": 1, "isinf": 1,
    "isfinite": 1, "isposinf": 1, "isneginf": 1, "logical_and": 1, "logical_or": 1,
    "logical_not": 1, "logical_xor": 1, "bitwise_and": 1, "bitwise_or": 1, "bitwise_xor": 1,
    "bitwise_not": 1, "bitwise_left_shift": 1, "bitwise_right_shift": 1, "where": 1,
    "masked_fill": 1, "clamp": 1, "clamp_min": 1, "clamp_max": 1, "clip": 1,
    "nan_to_num": 1, "heaviside": 1,
    "__and__": 1, "__or__": 1, "__xor__": 1, "__lshift__": 1, "__rshift__": 1,
    "__iand__": 1, "__ior__": 1, "__ixor__": 1, "__ilshift__": 1, "__irshift__": 1,
}


#: Real FLOPs per complex output element where the real arithmetic is known: a complex
#: multiply (a+bi)(c+di) is 4 real multiplies and 2 adds; a divide (a+bi)/(c+di) is c*c + d*d
#: (2 multiplies, 1 add), the two numerator parts (4 multiplies, 2 adds) and 2 divides. Any other
#: op on complex elements counts its real FLOPs once per part (real, imaginary): exact for add,
#: subtract and negate, a floor for the transcendental functions.
COMPLEX_FLOPS_PER_OUTPUT_ELEMENT: dict[str, int] = {"mul": 6, "div": 11}
REAL_PARTS_PER_COMPLEX = 2


def per_output_element(flops_per_element: int, complex_flops: int | None = None):
    """A formula of ``flops_per_element`` FLOPs per element of the first output, and of
    ``complex_flops`` (default: 2 x ``flops_per_element``) per complex element."""
    if complex_flops is None:
        complex_flops = REAL_PARTS_PER_COMPLEX * flops_per_element

    def pointwise(call: OpCall) -> Cost:
        per_element = complex_flops if call.out.dtype.is_complex else flops_per_element
        return call.cost(flops=per_element * call.out.numel)

    pointwise.__qualname__ = f"pointwise[{flops_per_element} per output element]"
    return pointwise


def _register_table() -> None:
    # The table names packets; an in-place variant (add_) is the same work.
    for name, flops in FLOPS_PER_OUTPUT_ELEMENT.items():
        register_formula(*aten_ops(name))(
            per_output_element(flops, COMPLEX_FLOPS_PER_OUTPUT_ELEMENT.get(name)))


_register_table()

#: Special functions with a kernel and no decomposition, one transcendental operation each (the
#: others lower to prims, prims.py).
SPECIAL_FUNCTIONS = aten_ops(
    "special_bessel_y0", "special_bessel_y1", "special_modified_bessel_i0",
    "special_modified_bessel_i1", "special_modified_bessel_k0", "special_modified_bessel_k1",
    "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1", "special_airy_ai")
register_formula(*SPECIAL_FUNCTIONS)(per_output_element(1))

FORMULAS.register_value_dependent(
    aten_ops(*(f"special_{kind}_polynomial_{letter}" for kind, letters in (
        ("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ("h", "he")),
        ("laguerre", "l"), ("legendre", "p")) for letter in letters), in_place=False),
    "evaluates a polynomial of degree n by a recurrence of up to n steps, or by a closed "
    "form where x allows, chosen per element: its work depends on the values",
)


@register_formula(aten.dropout, aten.dropout_, aten.native_dropout, aten.feature_dropout,
                  aten.feature_dropout_, aten.alpha_dropout, aten.alpha_dropout_,
                  aten.feature_alpha_dropout, aten.feature_alpha_dropout_)
def dropout(call: OpCall) -> Cost:
    # Training: draw a keep mask (1) and scale the kept values (1) per element; eval: identity.
    training = call.get("train", True)
    return call.cost(flops=2 * call.out.numel if training else 0, moves_data=bool(training))


@register_formula(aten.diff)
def diff(call: OpCall) -> Cost:
    """n-th forward difference along ``dim``: order k subtracts L0 - k adjacent pairs per row,
    L0 being the length with ``prepend``/``append`` and L0 - n the output's length."""
    n, out = call.get("n", 1), call.out
    dim = call.get("dim", -1) % out.ndim
    length = out.shape[dim] + n
    rows = out.numel // out.shape[dim] if out.shape[dim] != 0 else 0
    return call.cost(flops=rows * sum(length - k for k in range(1, n + 1)))
