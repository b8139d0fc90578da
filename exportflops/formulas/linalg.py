"""Linear algebra with its own kernel: triangular solves, and the direct factorizations (LU,
Cholesky, Householder QR) with the solves, inverses and determinants torch builds on them.

Convention: each kernel is counted by definition, as the textbook algorithm it implements does
its arithmetic, whatever the kernel (LAPACK's blocked routines, a GPU solver): the same
multiply-accumulates in another order. Pivot searches and row swaps compare and move, and are not
counted. Counts are exact sums over the algorithm's steps (`_over_steps`); their leading terms are
the published ones (Golub and Van Loan, Matrix Computations, 4th ed.: LU 2n^3/3, Cholesky n^3/3,
Householder QR 2n^2 (m - n/3)), and the triangular solve, Cholesky and the LU solve match LAPACK's
exact counts (LAPACK Working Note 41) term for term. torch.utils.flop_counter has no formula for
any of them.

- Triangular solve (forward or back substitution): for one right-hand side of an n x n triangle,
  row i subtracts i - 1 products of the row's off-diagonal entries with the solved unknowns,
  n (n - 1) / 2 multiply-accumulates in all, then divides by the diagonal entry: n divisions, none
  when the triangle is unit (its diagonal taken as ones, never read). Each of the k right-hand
  sides (columns of B; rows when ``left=False``, X A = B) is one such solve: over a batch,
  ``out.numel (n - 1) / 2`` MACs (out holds batch x k x n unknowns), n^2 k FLOPs for a general
  triangle, LAPACK's count for trsm.
- LU with partial pivoting of an m x n matrix: step j (j = 1 .. min(m, n)) divides the m - j
  entries below the pivot by it, then updates the (m - j) x (n - j) trailing block, one MAC per
  entry. An LU solve is a unit-lower then an upper substitution; torch's inverse solves against
  the identity (`linalg_inv_ex` calls `linalg_solve_ex` with B = I), so it is counted so.
- Cholesky A = L L^H of an n x n matrix: step j takes one square root, divides the n - j entries
  below the diagonal by it and updates the lower triangle of the trailing block,
  (n - j) (n - j + 1) / 2 MACs.
- Householder QR (Golub and Van Loan, algorithms 5.1.1 and 5.2.1) of an m x n matrix: step j
  (j = 1 .. min(m - 1, n); a last row needs no reflector) builds a reflector of length
  r = m - j + 1 (its norm: r MACs; a square root, a sign add, tau's division and r - 1 scalings:
  r + 2 FLOPs) and applies it to the n - j columns on its right: w = v^H C (r MACs per column),
  C -= tau v w^H (r MACs and tau's product per column). Forming Q (``linalg_qr``'s Q,
  ``householder_product``) applies the reflectors in reverse to the columns of the identity it
  keeps (backward accumulation); ``ormqr`` applies them to a given matrix.

Complex arithmetic: a complex MAC is 4 real MACs (`contraction`), a complex division 11 real
FLOPs, a division by a real number (the Cholesky diagonal) 2, a reflector's other scalar
operations 2 (one per part). LDL^H (Bunch-Kaufman's 1x1 and 2x2
pivots, chosen by the values), SVD and the eigensolvers (iterative: their sweeps depend on the
values) and the matrix exponential (its degree chosen from the norm) have no formula: they are
declared value-dependent and reported uncounted with that reason.
"""

from __future__ import annotations

import math

import sympy


from .matmul import contraction
from .pointwise import COMPLEX_FLOPS_PER_OUTPUT_ELEMENT, REAL_PARTS_PER_COMPLEX
from .registry import FORMULAS, Cost, OpCall, TensorMeta, aten_ops, register_formula, aten


#: Real FLOPs of one complex divide: pointwise.py's count (11).
REAL_FLOPS_PER_COMPLEX_DIVIDE = COMPLEX_FLOPS_PER_OUTPUT_ELEMENT["div"]
#: Real FLOPs of one complex multiply: pointwise.py's count (6).
REAL_FLOPS_PER_COMPLEX_MULTIPLY = COMPLEX_FLOPS_PER_OUTPUT_ELEMENT["mul"]
#: Real FLOPs of a complex number divided by a real one: each part divided.
REAL_FLOPS_PER_COMPLEX_BY_REAL_DIVIDE = 2


def _over_steps(term, steps):
    """``term(1) + ... + term(steps)``: a loop for a known count, the closed form for a
    symbolic one (an exact polynomial)."""
    if isinstance(steps, int):
        return sum(term(j) for j in range(1, steps + 1))
    j = sympy.Dummy("j", integer=True, positive=True)
    return sympy.expand(sympy.summation(term(j), (j, 1, steps)))


def _shorter(a, b):
    """The smaller of two sizes (symbolic when either is)."""
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else sympy.Min(a, b)


def _matrices(t: TensorMeta):
    """Matrices in a batch: the product of the leading (batch) dimensions."""
    return math.prod(t.shape[:-2])


def _per_real(call: OpCall, count, complex_flops: int):
    """``count`` real operations, ``complex_flops`` real FLOPs each when the call is complex."""
    return complex_flops * count if call.out.dtype.is_complex else count


def _cost(call: OpCall, macs, divisions=0, *, real_divisor: bool = False, other_flops=0) -> Cost:
    # contraction() counts the MACs (4 real ones per complex MAC) and the bytes.
    per_division = (REAL_FLOPS_PER_COMPLEX_BY_REAL_DIVIDE if real_divisor
                    else REAL_FLOPS_PER_COMPLEX_DIVIDE)
    return contraction(call, macs) + Cost(flops=_per_real(call, divisions, per_division)
                                          + other_flops)


def _exact(numerator, denominator):
    """``numerator / denominator`` for a numerator the algorithm makes a multiple of it."""
    if isinstance(numerator, sympy.Basic):
        return numerator / denominator
    return numerator // denominator


def _substitution_macs(unknowns, n):
    """MACs of solving for ``unknowns`` unknowns by substitution in n x n triangles."""
    return _exact(unknowns * (n - 1), 2)


def _lu(m, n) -> tuple:
    """(MACs, divisions) of LU with partial pivoting on one m x n matrix."""
    steps = _shorter(m, n)
    return (_over_steps(lambda j: (m - j) * (n - j), steps),
            _over_steps(lambda j: m - j, steps))


def _lu_of(A: TensorMeta) -> tuple:
    """(MACs, divisions) of factoring every matrix of ``A``'s batch."""
    macs, divisions = _lu(*A.shape[-2:])
    return _matrices(A) * macs, _matrices(A) * divisions


def _lu_solve(unknowns, n) -> tuple:
    """(MACs, divisions) of a unit-lower then an upper substitution for ``unknowns``."""
    return 2 * _substitution_macs(unknowns, n), unknowns


@register_formula(aten.linalg_solve_triangular, aten.triangular_solve)
def triangular_solve(call: OpCall) -> Cost:
    """``torch.linalg.solve_triangular(A, B, upper=, left=, unitriangular=)`` and the older
    ``torch.triangular_solve(B, A, ...)``: A (*, n, n), the solution X broadcast to B's shape;
    the older API's second output is a copy of A (data movement, no arithmetic)."""
    n, unknowns = call.get("A", call.get("self")).shape[-1], call.out.numel
    unit = bool(call.get("unitriangular", False))
    return _cost(call, _substitution_macs(unknowns, n), 0 if unit else unknowns)


@register_formula(aten.linalg_lu_factor_ex, aten.linalg_lu, aten._lu_with_info)
def lu_factor(call: OpCall) -> Cost:
    """``torch.linalg.lu_factor`` (packed LU and pivots), ``torch.linalg.lu`` (P, L, U unpacked:
    copies), A (*, m, n)."""
    return _cost(call, *_lu_of(call.get("A", call.get("self"))))


@register_formula(aten.linalg_lu_solve, aten.lu_solve)
def lu_solve(call: OpCall) -> Cost:
    """``torch.linalg.lu_solve(LU, pivots, B, left=, adjoint=)``: two substitutions per
    right-hand side, the solution broadcast to B's shape."""
    n = call.get("LU", call.get("LU_data")).shape[-1]
    return _cost(call, *_lu_solve(call.out.numel, n))


@register_formula(aten._linalg_solve_ex, aten.linalg_inv_ex)
def linalg_solve(call: OpCall) -> Cost:
    """``torch.linalg.solve(A, B, left=)``: LU of each matrix of A (its own batch, before
    broadcasting), then the two substitutions for every unknown of the broadcast solution.
    ``torch.linalg.inv(A)`` (and ``torch.inverse``) is torch's solve of A X = I: n right-hand
    sides, the identity's zeros not exploited."""
    A = call["A"]
    factor_macs, factor_divisions = _lu_of(A)
    macs, divisions = _lu_solve(call.out.numel, A.shape[-1])
    return _cost(call, factor_macs + macs, factor_divisions + divisions)


@register_formula(aten._linalg_det)
def linalg_det(call: OpCall) -> Cost:
    """``torch.linalg.det(A)``: LU, then the product of U's diagonal (n - 1 multiplies) times
    the permutation's sign (1), per matrix."""
    A = call["A"]
    products = _per_real(call, _matrices(A) * A.shape[-1], REAL_FLOPS_PER_COMPLEX_MULTIPLY)
    return _cost(call, *_lu_of(A), other_flops=products)


@register_formula(aten._linalg_slogdet)
def linalg_slogdet(call: OpCall) -> Cost:
    """``torch.linalg.slogdet(A)``, ``logdet``: LU, then per matrix the sign (each diagonal
    entry's sign, n; their product and the permutation's sign, n) and log|det| (each entry's
    abs and log, 2n; their sum, n - 1): 5n - 1 FLOPs, the complex signs' products 6 each."""
    A = call["A"]
    n, matrices = A.shape[-1], _matrices(A)
    products = _per_real(call, matrices * n, REAL_FLOPS_PER_COMPLEX_MULTIPLY)
    return _cost(call, *_lu_of(A), other_flops=matrices * (4 * n - 1) + products)


def _cholesky(n) -> tuple:
    """(MACs, divisions, square roots) of Cholesky on one n x n matrix."""
    return (_over_steps(lambda j: _exact((n - j) * (n - j + 1), 2), n),
            _over_steps(lambda j: n - j, n), n)


@register_formula(aten.linalg_cholesky_ex, aten.cholesky)
def cholesky(call: OpCall) -> Cost:
    """``torch.linalg.cholesky(A, upper=)``, ``torch.cholesky``: A (*, n, n)."""
    A = call["self"]
    macs, divisions, roots = (_matrices(A) * count for count in _cholesky(A.shape[-1]))
    return _cost(call, macs, divisions, real_divisor=True, other_flops=roots)


@register_formula(aten.cholesky_solve, aten._cholesky_solve_helper)
def cholesky_solve(call: OpCall) -> Cost:
    """``torch.cholesky_solve(B, L, upper=)``: two substitutions with the (non-unit) factor and
    its conjugate transpose per right-hand side, dividing by L's real diagonal."""
    n, unknowns = call.get("input2", call.get("A")).shape[-1], call.out.numel
    return _cost(call, 2 * _substitution_macs(unknowns, n), 2 * unknowns, real_divisor=True)


@register_formula(aten.cholesky_inverse)
def cholesky_inverse(call: OpCall) -> Cost:
    """``torch.cholesky_inverse(L, upper=)``, as LAPACK's potri: X = L^-1 (column j: n - j + 1
    divisions and (n - j)(n - j + 1)/2 MACs), then the lower triangle of X^H X (row i: i entries
    of n - i + 1 MACs; the upper triangle is copied). cuSOLVER's path instead solves against the
    identity, about three times this."""
    L = call["self"]
    n, matrices = L.shape[-1], _matrices(L)
    inverse_macs, _, _ = _cholesky(n)
    product_macs = _over_steps(lambda i: i * (n - i + 1), n)
    divisions = _over_steps(lambda j: n - j + 1, n)
    return _cost(call, matrices * (inverse_macs + product_macs), matrices * divisions,
                 real_divisor=True)


def _reflectors(rows):
    """The length of reflector j of a Householder factorization of ``rows`` rows."""
    return lambda j: rows - j + 1


def _factor_qr(m, n) -> tuple:
    """(MACs, other FLOPs, reflectors) of Householder QR on one m x n matrix."""
    steps, length = _shorter(m - 1, n), _reflectors(m)
    macs = _over_steps(lambda j: length(j) * (1 + 2 * (n - j)), steps)
    flops = _over_steps(lambda j: length(j) + 2 + (n - j), steps)
    return macs, flops, steps


def _apply_reflectors(length, columns, steps) -> tuple:
    """(MACs, other FLOPs) of applying ``steps`` reflectors, step j of ``length(j)`` to
    ``columns(j)`` columns: w = v^H C and C -= tau v w^H."""
    return (_over_steps(lambda j: 2 * length(j) * columns(j), steps),
            _over_steps(columns, steps))


def _reflector_cost(call: OpCall, matrices, macs, other_flops) -> Cost:
    return _cost(call, matrices * macs,
                 other_flops=_per_real(call, matrices * other_flops, REAL_PARTS_PER_COMPLEX))


@register_formula(aten.geqrf)
def geqrf(call: OpCall) -> Cost:
    """``torch.geqrf(A)``: the reflectors and R, packed; A (*, m, n)."""
    A = call["self"]
    macs, flops, _ = _factor_qr(*A.shape[-2:])
    return _reflector_cost(call, _matrices(A), macs, flops)


@register_formula(aten.linalg_qr)
def linalg_qr(call: OpCall) -> Cost:
    """``torch.linalg.qr(A, mode=)``: the factorization, then for ``'reduced'`` (Q's
    min(m, n) columns) and ``'complete'`` (all m) Q by backward accumulation; ``'r'`` forms
    no Q."""
    A = call["A"]
    m, n = A.shape[-2:]
    macs, flops, steps = _factor_qr(m, n)
    mode = call.get("mode", "reduced")
    if mode != "r":
        kept = m if mode == "complete" else _shorter(m, n)
        q_macs, q_flops = _apply_reflectors(_reflectors(m), lambda j: kept - j + 1, steps)
        macs, flops = macs + q_macs, flops + q_flops
    return _reflector_cost(call, _matrices(A), macs, flops)


@register_formula(aten.linalg_householder_product)
def householder_product(call: OpCall) -> Cost:
    """``torch.linalg.householder_product(A, tau)``: Q's n columns from k = tau's length
    reflectors of A (*, m, n), by backward accumulation."""
    A, steps = call["input"], call["tau"].shape[-1]
    m, n = A.shape[-2:]
    macs, flops = _apply_reflectors(_reflectors(m), lambda j: n - j + 1, steps)
    return _reflector_cost(call, _matrices(A), macs, flops)


@register_formula(aten.ormqr)
def ormqr(call: OpCall) -> Cost:
    """``torch.ormqr(A, tau, C, left=, transpose=)``: the k = tau's length reflectors applied
    to each matrix of C (*, m, n), from the left (reflector j spans rows j..m, every column) or
    the right (columns j..n, every row)."""
    C, steps = call["input3"], call["input2"].shape[-1]
    m, n = C.shape[-2:]
    spanned, other = (m, n) if call.get("left", True) else (n, m)
    macs, flops = _apply_reflectors(_reflectors(spanned), lambda j: other, steps)
    return _reflector_cost(call, _matrices(call.out), macs, flops)


#: Why an SVD or eigensolver has no count from shapes (also prims.svd's, in prims.py).
ITERATIVE = ("is iterative: the solver sweeps until the values converge, so its work depends "
             "on the matrix, not only on its shape")
FORMULAS.register_value_dependent(
    aten_ops("_linalg_svd", "_linalg_eigh", "linalg_eig", "_linalg_eigvals", in_place=False),
    ITERATIVE,
)
FORMULAS.register_value_dependent(
    aten_ops("linalg_pinv", in_place=False),
    "runs an SVD (an eigendecomposition when hermitian), iterative: its work depends on the "
    "matrix, not only on its shape",
)
FORMULAS.register_value_dependent(
    aten_ops("linalg_matrix_exp", in_place=False),
    "scales and squares with a Pade degree and a number of squarings chosen from the "
    "matrix's norm: its work depends on the values",
)
FORMULAS.register_value_dependent(
    aten_ops("linalg_ldl_factor_ex", "linalg_ldl_solve", in_place=False),
    "pivots as Bunch-Kaufman does, in 1x1 or 2x2 blocks as the values decide: its work "
    "depends on them",
)
FORMULAS.register_zero(
    aten_ops("lu_unpack"),
    "data movement: unpacks L, U and the permutation from a packed LU factorization",
    moves="copy",
)
FORMULAS.register_zero(
    aten_ops("_linalg_check_errors", in_place=False),
    "checks a factorization's integer status codes for errors, no arithmetic",
    moves="copy",
)
