"""Linear algebra with its own kernel: triangular solves (``linalg_solve_triangular``,
``triangular_solve``).

Convention: a triangular solve is forward (or back) substitution, counted by definition whatever
the kernel (LAPACK's trsm, a blocked GPU solver): solving an n x n triangular system for one
right-hand side, row i subtracts i - 1 products of the row's off-diagonal entries with the
solved unknowns, n (n - 1) / 2 multiply-accumulates in all, then divides by the diagonal entry:
n divisions, none when ``unitriangular`` (the diagonal is taken as ones and never read). Each of
the k right-hand sides (columns of B; rows when ``left=False``, X A = B) is one such solve, so
k n (n - 1) / 2 MACs and, over a batch, ``out.numel (n - 1) / 2`` (out holds batch x k x n
unknowns; n (n - 1) is even, so the division is exact). FLOPs: 2 per MAC plus one per division,
n^2 k in all for a general triangle, LAPACK's count for trsm (Golub and Van Loan, Matrix
Computations, 4th ed., section 3.1). torch.utils.flop_counter has no formula for either op.
"""

from __future__ import annotations

import torch

from .matmul import contraction
from .pointwise import COMPLEX_FLOPS_PER_OUTPUT_ELEMENT
from .registry import Cost, OpCall, register_formula

aten = torch.ops.aten


#: Real FLOPs of one complex divide: pointwise.py's count (11).
REAL_FLOPS_PER_COMPLEX_DIVIDE = COMPLEX_FLOPS_PER_OUTPUT_ELEMENT["div"]


def _substitution(call: OpCall, unknowns, n, unitriangular: bool) -> Cost:
    # contraction() counts the MACs (4 real ones per complex MAC) and the bytes.
    divisions = 0 if unitriangular else unknowns
    if call.out.dtype.is_complex:
        divisions = REAL_FLOPS_PER_COMPLEX_DIVIDE * divisions
    return contraction(call, unknowns * (n - 1) // 2) + Cost(flops=divisions)


@register_formula(aten.linalg_solve_triangular)
def linalg_solve_triangular(call: OpCall) -> Cost:
    """``torch.linalg.solve_triangular(A, B, upper=, left=, unitriangular=)``: A (*, n, n), the
    solution X broadcast to B's shape."""
    n = call["self"].shape[-1]
    return _substitution(call, call.out.numel, n, bool(call.get("unitriangular", False)))


@register_formula(aten.triangular_solve)
def triangular_solve(call: OpCall) -> Cost:
    """``torch.triangular_solve(B, A, upper, transpose, unitriangular)`` (the older API): the same
    substitution; its second output is a copy of A (data movement, no arithmetic)."""
    n = call["A"].shape[-1]
    return _substitution(call, call.out.numel, n, bool(call.get("unitriangular", False)))
