"""Matrix products: mm, addmm, bmm, baddbmm, linear, matmul, einsum, _scaled_mm, _grouped_mm,
_scaled_grouped_mm, and the quantized kernels (_int_mm, _weight_int8pack_mm,
_weight_int4pack_mm*, _dyn_quant_matmul_4bit, _mixed_dtypes_linear).

Convention (torch.utils.flop_counter, Karpathy): one MAC per multiply-accumulate, 2 FLOPs per MAC.
A bias or ``beta * self`` term adds one FLOP per output element; it is not a MAC.
"""

from __future__ import annotations

import math


from ..errors import FormulaError
from .registry import FLOPS_PER_MAC, Cost, OpCall, register_formula, aten


#: Real MACs per complex MAC: (a+bi)(c+di) accumulated is 4 real multiplies and 4 real adds
#: (ac, bd, ad, bc; ac-bd and ad+bc, then the two accumulating adds), i.e. 4 real MACs. Counted
#: by definition, whatever trick a kernel uses (torch's complex convolution runs Gauss's
#: 3-multiply form).
REAL_MACS_PER_COMPLEX_MAC = 4
#: Real adds per complex add (the real and the imaginary parts).
REAL_ADDS_PER_COMPLEX_ADD = 2


def contraction(call: OpCall, macs, *, bias_elements=0) -> Cost:
    """Cost of ``macs`` multiply-accumulates plus one add per biased output element, in real
    arithmetic: a complex output counts each complex MAC as 4 real MACs, each add as 2."""
    if call.outputs and call.out.dtype.is_complex:
        macs = REAL_MACS_PER_COMPLEX_MAC * macs
        bias_elements = REAL_ADDS_PER_COMPLEX_ADD * bias_elements
    return call.cost(flops=FLOPS_PER_MAC * macs + bias_elements, macs=macs)


@register_formula(aten.mm, aten._scaled_mm, aten._scaled_mm_v2, aten._int_mm)
def mm(call: OpCall) -> Cost:
    (m, k), n = call["self"].shape, call["mat2"].shape[-1]
    bias = call.out.numel if call.get("bias") is not None else 0
    return contraction(call, m * n * k, bias_elements=bias)


@register_formula(aten.addmm)
def addmm(call: OpCall) -> Cost:
    (m, k), n = call["mat1"].shape, call["mat2"].shape[-1]
    return contraction(call, m * n * k, bias_elements=_beta_term(call))


@register_formula(aten.bmm)
def bmm(call: OpCall) -> Cost:
    b, m, k = call["self"].shape
    return contraction(call, b * m * call["mat2"].shape[-1] * k)


@register_formula(aten.baddbmm)
def baddbmm(call: OpCall) -> Cost:
    b, m, k = call["batch1"].shape
    return contraction(call, b * m * call["batch2"].shape[-1] * k, bias_elements=_beta_term(call))


@register_formula(aten.addbmm)
def addbmm(call: OpCall) -> Cost:
    """``beta * self + alpha * sum_b batch1[b] @ batch2[b]``: b*m*n*k MACs (the batch sum is the
    accumulation), plus the add of ``self``."""
    b, m, k = call["batch1"].shape
    return contraction(call, b * m * call["batch2"].shape[-1] * k, bias_elements=_beta_term(call))


@register_formula(aten.linear)
def linear(call: OpCall) -> Cost:
    in_features = call["weight"].shape[-1]
    bias = call.out.numel if call.get("bias") is not None else 0
    return contraction(call, call.out.numel * in_features, bias_elements=bias)


@register_formula(aten.matmul, aten.dot, aten.vdot, aten.mv)
def matmul(call: OpCall) -> Cost:
    # Every output element (1 for a dot product) is one length-k inner product, k being the
    # first operand's last dimension whatever the broadcasting (torch.matmul semantics).
    a = call["self"]
    return contraction(call, call.out.numel * a.shape[-1])


@register_formula(aten.addmv)
def addmv(call: OpCall) -> Cost:
    m, k = call["mat"].shape
    return contraction(call, m * k, bias_elements=_beta_term(call))


@register_formula("transformers::grouped_mm_fallback")
def grouped_mm_rows(call: OpCall) -> Cost:
    """Hugging Face's MoE fallback: rows of ``input`` (S, K), sorted by expert, each times its
    expert's (K, N) weight: S*K*N MACs, whichever expert each row went to."""
    return contraction(call, call.out.numel * call["input"].shape[-1])


@register_formula("transformers::grouped_mm_fallback_backward")
def grouped_mm_rows_backward(call: OpCall) -> Cost:
    """Its gradients: grad_input = grad_output W^T and grad_weight = input^T grad_output,
    S*K*N MACs each."""
    rows, k = call["input"].shape
    return contraction(call, 2 * rows * k * call["grad_output"].shape[-1])


@register_formula(aten._grouped_mm, aten._scaled_grouped_mm)
def grouped_mm(call: OpCall) -> Cost:
    a, b = call["self"], call["mat2"]
    if a.ndim == 2 and b.ndim == 2:
        # Groups split the shared K dimension: the output holds one (M, N) block per group and
        # each block sums over its own slice of K, so the work is M*N*K in all.
        macs = a.shape[0] * b.shape[1] * a.shape[1]
    else:
        macs = call.out.numel * a.shape[-1]
    bias = call.out.numel if call.get("bias") is not None else 0
    return contraction(call, macs, bias_elements=bias)


@register_formula(aten._weight_int8pack_mm)
def int8_weight_mm(call: OpCall) -> Cost:
    """Activations ``(m, k)`` times an int8 weight stored ``(n, k)``, each output then scaled by
    its channel's scale (torch's reference: ``(x @ w.T) * scales``): m*n*k MACs and one
    multiply per output, counted as a bias term is."""
    (m, k), n = call["self"].shape, call["mat2"].shape[0]
    return contraction(call, m * n * k, bias_elements=call.out.numel)


@register_formula(aten._weight_int4pack_mm, aten._weight_int4pack_mm_for_cpu,
                  aten._weight_int4pack_mm_with_scales_and_zeros)
def int4_weight_mm(call: OpCall) -> Cost:
    """Activations ``(m, k)`` times an int4 weight packed in the kernel's tiled layout, whose
    shape is no ``(n, k)``: n is the output's. Each group of qGroupSize weights along k has a
    scale and a zero; dequantizing is a multiply and an add per weight element, counted once
    per call (the shift of the int4 value by 8 is part of its conversion to a float, not
    counted): m*n*k MACs + 2*n*k."""
    k, n = call["self"].shape[-1], call.out.shape[-1]
    macs = call.out.numel * k
    return call.cost(flops=FLOPS_PER_MAC * macs + 2 * n * k, macs=macs)


@register_formula(aten._dyn_quant_matmul_4bit)
def dynamically_quantized_int4_mm(call: OpCall) -> Cost:
    """Activations ``(m, k)`` quantized on the fly to int8, one scale per row (its max-abs: a
    compare per element, then a multiply per element), times int4 weights packed with their
    block scales (KleidiAI's layout: n and k are ``out_features`` and ``in_features``): m*n*k
    MACs, 2*m*k to quantize the activations, n*k to apply the weights' scales, once per call."""
    k, n = call["in_features"], call["out_features"]
    rows = math.prod(call["inp"].shape[:-1])
    macs = rows * n * k
    return call.cost(flops=FLOPS_PER_MAC * macs + 2 * rows * k + n * k, macs=macs)


@register_formula(aten._mixed_dtypes_linear)
def mixed_dtypes_linear(call: OpCall) -> Cost:
    """float16/bfloat16 activations ``(*, k)`` times an int8 or packed-uint4 weight (CUTLASS's
    reordered layout: n is the output's), as torch's reference computes it:
    ``activation(input @ (weight * scale).T + bias)``: m*n*k MACs, a multiply per weight
    element to dequantize (n*k, once per call), an add per output for a bias and one FLOP per
    output for ``activation`` (``'relu'``, ``'silu'``)."""
    k, n = call["input"].shape[-1], call.out.shape[-1]
    macs = call.out.numel * k
    per_output = (call.get("bias") is not None) + (call.get("activation") not in (None, "none"))
    return call.cost(flops=FLOPS_PER_MAC * macs + n * k + per_output * call.out.numel, macs=macs)


def _beta_term(call: OpCall):
    return 0 if call.get("beta", 1) == 0 else call.out.numel


@register_formula(aten.einsum)
def einsum(call: OpCall) -> Cost:
    """The work of torch's own einsum (aten/src/ATen/native/Linear.cpp, no opt_einsum): the
    operands are multiplied left to right, a pair at a time.

    1. An operand whose dimension is 1 where another operand's is larger broadcasts: it does not
       carry that label. (A label of size 1 in every operand is carried: a contraction of
       length 1 is one MAC per product, as ``mm`` counts k = 1, though torch runs it as a mul.)
    2. A contracted label that only one side of a pair carries, and no later operand needs, is
       summed out of that side first (a reduction: 1 FLOP per element read).
    3. The pair is then one bmm over the labels both carry and no later operand needs: one MAC
       per combination of all the labels either carries. With no such label it is a pointwise
       product (1 FLOP per element, no MAC).
    A single operand is a reduction over its contracted labels.
    """
    terms, tensors, output_letters = _split(call)
    operands = _operands(terms, tensors)
    contracted = set().union(*(o.sizes for o in operands)) - set(output_letters)
    if len(operands) == 1:
        return call.cost(flops=_reduced(operands[0], contracted)[0])
    # torch's dim_counts: how many of the operands not yet multiplied carry each label.
    carriers = {label: sum(label in o.sizes for o in operands) for label in contracted}
    flops, macs, left = 0, 0, operands[0]
    for right in operands[1:]:
        step_flops, step_macs, left = _multiply_pair(left, right, carriers)
        flops, macs = flops + step_flops, macs + step_macs
    return call.cost(flops=FLOPS_PER_MAC * macs + flops, macs=macs)


def _multiply_pair(left: _Operand, right: _Operand, carriers: dict) -> tuple:
    """(non-MAC FLOPs, MACs, product) of one pairwise step; updates ``carriers``."""
    summed_now, left_only, right_only = set(), set(), set()
    for label in carriers:
        if label in left.sizes and label in right.sizes:
            carriers[label] -= 1
            if carriers[label] == 1:
                summed_now.add(label)
                carriers[label] = 0
        elif carriers[label] == 1 and (label in left.sizes or label in right.sizes):
            (left_only if label in left.sizes else right_only).add(label)
            carriers[label] = 0
    left_flops, left = _reduced(left, left_only)
    right_flops, right = _reduced(right, right_only)
    product = _Operand({**left.sizes, **right.sizes})
    if not summed_now:
        return left_flops + right_flops + product.numel, 0, product
    return left_flops + right_flops, product.numel, product.without(summed_now)


def _reduced(operand: _Operand, labels: set) -> tuple:
    """(FLOPs, result) of summing ``labels`` out of ``operand``; summing size 1 is free."""
    if all(operand.sizes[c] == 1 for c in labels & operand.sizes.keys()):
        return 0, operand.without(labels)
    return operand.numel, operand.without(labels)


class _Operand:
    """The labels an einsum operand carries, and their sizes."""

    def __init__(self, sizes: dict) -> None:
        self.sizes = sizes

    @property
    def numel(self):
        return math.prod(self.sizes.values())

    def without(self, labels: set) -> _Operand:
        return _Operand({c: s for c, s in self.sizes.items() if c not in labels})


def _operands(terms: list[str], tensors: list) -> list[_Operand]:
    for term, t in zip(terms, tensors, strict=True):
        if len(term) != t.ndim:
            raise FormulaError(f"einsum term {term!r} does not match operand shape {t.shape}")
    shapes = [dict(zip(term, t.shape)) for term, t in zip(terms, tensors)]
    broadcast = {}  # label -> its size in the operands where it is not 1, else 1
    for shape in shapes:
        broadcast.update({c: s for c, s in shape.items() if s != 1 or c not in broadcast})
    return [_Operand({c: s for c, s in shape.items() if s != 1 or broadcast[c] == 1})
            for shape in shapes]


def _split(call: OpCall) -> tuple[list[str], list, str]:
    """Equation -> (one letter string per operand, operand metas, output letters).

    '...' is expanded."""
    equation = call["equation"].replace(" ", "")
    tensors = list(call["tensors"])
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    ellipsis_rank = max((t.ndim - len(term.replace("...", "")) for term, t in zip(terms, tensors)
                         if "..." in term), default=0)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation][:ellipsis_rank]

    def expand(term: str, rank: int) -> str:
        return term.replace("...", "".join(free[len(free) - rank:]))

    terms = [expand(term, t.ndim - len(term.replace("...", ""))) for term, t in zip(terms, tensors)]
    if arrow:
        output = expand(rhs, ellipsis_rank)
    else:
        letters = "".join(terms)
        output = "".join(free) + "".join(sorted(c for c in set(letters) - set(free)
                                                if letters.count(c) == 1))
    return terms, tensors, output


@register_formula(aten._trilinear)
def trilinear(call: OpCall) -> Cost:
    """``_trilinear`` (what ``bilinear`` runs): the three inputs, each unsqueezed at its
    ``expand`` dims to one shared rank, multiplied and summed over ``sumdim``. torch multiplies
    them a pair at a time, i1 with i2 then with i3, as its einsum does: counted as that einsum."""
    inputs = [call["i1"], call["i2"], call["i3"]]
    letters = [chr(ord("a") + d) for d in range(inputs[0].ndim + len(call["expand1"]))]
    terms = ["".join(c for d, c in enumerate(letters) if d not in call[f"expand{k}"])
             for k in (1, 2, 3)]
    output = "".join(c for d, c in enumerate(letters) if d not in call["sumdim"])
    return einsum(OpCall(call.op, {"equation": f"{','.join(terms)}->{output}",
                                   "tensors": inputs}, call.outputs))
