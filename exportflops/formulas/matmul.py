"""Matrix products: mm, addmm, bmm, baddbmm, linear, matmul, einsum, _scaled_mm, _grouped_mm.

Convention (torch.utils.flop_counter, Karpathy): one MAC per multiply-accumulate, 2 FLOPs per MAC.
A bias or ``beta * self`` term adds one FLOP per output element; it is not a MAC.
"""

from __future__ import annotations

import math

import torch

from ..errors import FormulaError
from .registry import FLOPS_PER_MAC, Cost, OpCall, register_formula

aten = torch.ops.aten


def contraction(call: OpCall, macs, *, bias_elements=0) -> Cost:
    """Cost of ``macs`` multiply-accumulates plus one add per biased output element."""
    return call.cost(flops=FLOPS_PER_MAC * macs + bias_elements, macs=macs)


@register_formula(aten.mm, aten._scaled_mm)
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


@register_formula(aten._grouped_mm)
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


def _beta_term(call: OpCall):
    return 0 if call.get("beta", 1) == 0 else call.out.numel


@register_formula(aten.einsum)
def einsum(call: OpCall) -> Cost:
    """Operands are contracted left to right, pairwise, as torch does without opt_einsum.

    A pairwise step costs one MAC per combination of the indices either operand carries.
    """
    terms, tensors, output_letters = _split(call)
    operands = [_Operand.of(term, t.shape) for term, t in zip(terms, tensors, strict=True)]
    if len(operands) == 1:
        summed = operands[0].numel != math.prod(operands[0].sizes[c] for c in output_letters)
        return call.cost(flops=operands[0].numel if summed else 0)
    macs, left = 0, operands[0]
    for i, right in enumerate(operands[1:], start=1):
        # A broadcast index has size 1 in one operand: the other operand's size is the real one.
        sizes = {**right.sizes, **{c: s for c, s in left.sizes.items() if s != 1}}
        macs += math.prod(sizes.values())
        needed = set(output_letters).union(*(o.sizes for o in operands[i + 1:]))
        left = _Operand({c: s for c, s in sizes.items() if c in needed})
    return contraction(call, macs)


class _Operand:
    def __init__(self, sizes: dict) -> None:
        self.sizes = sizes

    @property
    def numel(self):
        return math.prod(self.sizes.values())

    @classmethod
    def of(cls, term: str, shape: tuple) -> _Operand:
        if len(term) != len(shape):
            raise FormulaError(f"einsum term {term!r} does not match operand shape {tuple(shape)}")
        return cls(dict(zip(term, shape)))


def _split(call: OpCall) -> tuple[list[str], list, str]:
    """Equation -> (one letter string per operand, operand metas, output letters), '...' expanded."""
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
