"""Direct factorizations and what torch builds on them, each counted by hand.

The per-step definitions are exportflops/formulas/linalg.py's (the textbook algorithms). Where
LAPACK publishes an exact count (LAPACK Working Note 41, "Installation Guide for LAPACK",
operation counts: potrf n^3/3 + n^2/2 + n/6, potrs and getrs 2 n^2 k and 2 n^2 k - n k) the
test checks ours against it; otherwise against Golub and Van Loan's leading terms (Matrix
Computations, 4th ed.: LU 2n^3/3, Cholesky n^3/3, Householder QR 2n^2 (m - n/3)).
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from exportflops import analyze
from exportflops.formulas import Cost
from tests.models import Call


def _counted(function, *tensors, **options):
    report = analyze(Call(function), tensors, **options)
    assert report.uncounted == []
    return report.total


def test_lu_of_tall_and_wide_matrices():
    """Step j divides the m - j entries below the pivot and updates (m - j) x (n - j) entries.
    Wide 3 x 5: steps 1, 2, 3 give 2*4 + 1*3 + 0 = 11 MACs and 2 + 1 + 0 = 3 divisions: 25
    FLOPs. Tall 5 x 3: 4*2 + 3*1 + 2*0 = 11 MACs, 4 + 3 + 2 = 9 divisions: 31 FLOPs."""
    wide = _counted(lambda a: torch.linalg.lu_factor(a)[0], torch.randn(3, 5))
    tall = _counted(lambda a: torch.linalg.lu(a)[2], torch.randn(5, 3))
    assert (wide.macs, wide.flops) == (11, 25)
    assert (tall.macs, tall.flops) == (11, 31)


def test_solve_factors_a_once_and_substitutes_each_right_hand_side():
    """A one 4 x 4 matrix, B 3 batches of 2 columns. LU: 3^2 + 2^2 + 1 = 14 MACs, 3 + 2 + 1 = 6
    divisions. Solutions: 24 unknowns, each n - 1 = 3 products in a forward and 3 in a back
    substitution halved over the triangle, 24 * 3 = 72 MACs, one division each in the back
    one: 24. FLOPs 2 * 86 + 30 = 202; the substitutions' 2 * 72 + 24 = 168 are LAPACK's getrs
    count 2 n^2 k - n k at n = 4, k = 6."""
    total = _counted(torch.linalg.solve, torch.randn(4, 4), torch.randn(3, 4, 2))
    assert (total.macs, total.flops) == (86, 202)


def test_inverse_solves_against_the_identity():
    """torch's linalg_inv_ex solves A X = I: LU (14 MACs, 6 divisions at n = 4) and 16
    unknowns, 16 * 3 = 48 MACs and 16 divisions. FLOPs 2 * 62 + 22 = 146, for both spellings."""
    for inverse in (torch.linalg.inv, torch.inverse):
        total = _counted(inverse, torch.randn(4, 4))
        assert (total.macs, total.flops) == (62, 146)


def test_determinants():
    """n = 4: LU is 14 MACs and 6 divisions (34 FLOPs). det multiplies U's 4 diagonal entries
    and the permutation's sign: 4 more, 38. slogdet: each diagonal entry's sign, abs and log
    (12), the signs' product with the permutation's (4), the logs' sum (3): 34 + 19 = 53."""
    det = _counted(torch.linalg.det, torch.randn(4, 4))
    logabsdet = _counted(lambda a: torch.linalg.slogdet(a)[1], torch.randn(4, 4))
    assert (det.macs, det.flops) == (14, 38)
    assert (logabsdet.macs, logabsdet.flops) == (14, 53)


def test_cholesky_is_lapacks_count():
    """n = 4: step j takes a square root, divides 4 - j entries and updates (4-j)(5-j)/2:
    MACs 6 + 3 + 1 = 10, divisions 6, roots 4: 30 FLOPs, LAPACK's potrf n^3/3 + n^2/2 + n/6 =
    64/3 + 8 + 2/3 = 30. Complex: each MAC 4 real ones (40), each division by the real diagonal
    2 real FLOPs: 80 + 12 + 4 = 96."""
    spd = torch.eye(4) * 4 + 1
    real = _counted(torch.linalg.cholesky, spd)
    complex_ = _counted(torch.linalg.cholesky, spd.to(torch.complex64))
    assert (real.macs, real.flops) == (10, 30)
    assert (complex_.macs, complex_.flops) == (40, 96)


@pytest.mark.skipif(not hasattr(torch.ops.aten, "cholesky"),
                    reason="torch 2.14 removed torch.cholesky (torch.linalg.cholesky remains)")
def test_the_old_cholesky_name_counts_as_the_new_one():
    spd = torch.eye(4) * 4 + 1
    old_name = _counted(torch.cholesky, spd)
    assert (old_name.macs, old_name.flops) == (10, 30)  # as derived above


def test_cholesky_solve_and_inverse():
    """cholesky_solve, n = 4, k = 2: two non-unit substitutions for 8 unknowns, 2 * 8 * 3 / 2 =
    24 MACs and 16 divisions: 64 FLOPs, LAPACK's potrs 2 n^2 k. cholesky_inverse, n = 3: X =
    L^-1 has x_ii = 1 / l_ii (3 divisions), x_21 and x_32 one product and a division each,
    x_31 two products and a division: 4 MACs, 6 divisions; the lower triangle of X^H X, entry
    (i, j) a sum of 4 - i products: 3 + 2*2 + 3*1 = 10 MACs. 2 * 14 + 6 = 34 FLOPs."""
    solved = _counted(torch.cholesky_solve, torch.randn(4, 2), torch.eye(4))
    inverse = _counted(torch.cholesky_inverse, torch.eye(3))
    assert (solved.macs, solved.flops) == (24, 64)
    assert (inverse.macs, inverse.flops) == (14, 34)


@pytest.mark.parametrize("mode, macs, flops", [("r", 31, 80), ("reduced", 71, 166),
                                               ("complete", 89, 205)])
def test_householder_qr_by_mode(mode, macs, flops):
    """A 4 x 3: reflector j has length r = 5 - j (j = 1, 2, 3); its norm is r MACs, building it
    r + 2 FLOPs, applying it to the 3 - j columns on its right 2 r MACs and 1 FLOP each.
    R: MACs 4*5 + 3*3 + 2*1 = 31, other FLOPs 8 + 6 + 4 = 18: 80. Q by backward accumulation,
    reflector j on columns j .. q: reduced (q = 3) 2*4*3 + 2*3*2 + 2*2*1 = 40 MACs and 3 + 2
    + 1 = 6 FLOPs, 71 and 166 in all; complete (q = 4) 32 + 18 + 8 = 58 MACs and 9: 89, 205."""
    total = _counted(lambda a: torch.linalg.qr(a, mode=mode)[-1 if mode == "r" else 0],
                     torch.randn(4, 3))
    assert (total.macs, total.flops) == (macs, flops)


@pytest.mark.parametrize("factor, leading", [
    (torch.linalg.lu_factor, 2 / 3), (torch.linalg.cholesky, 1 / 3),
    (lambda a: torch.linalg.qr(a, mode="r"), 4 / 3), (torch.linalg.inv, 8 / 3),
])
def test_leading_terms_are_the_published_ones(factor, leading):
    """At n = 400 the lower-order terms are under 1 %: LU 2n^3/3, Cholesky n^3/3 and R of a
    square QR 2n^2 (n - n/3) = 4n^3/3 (Golub and Van Loan); inv's LU plus n solves 2n^3."""
    n = 400
    flops = _counted(factor, torch.empty(n, n, device="meta")).flops
    assert flops == pytest.approx(leading * n**3, rel=0.01)


def test_a_dynamic_size_gives_the_same_counts():
    """Cholesky of b matrices of a dynamic n, evaluated at b = 2, n = 4: twice the 30 above."""
    n, b = Dim("n", min=2, max=64), Dim("b", min=2, max=64)
    report = analyze(Call(torch.linalg.cholesky), (torch.eye(5).expand(3, 5, 5).clone(),),
                     dynamic_shapes=(({0: b, 1: n, 2: n},),))  # *tensors
    assert report.uncounted == []
    assert report.evaluate(b=2, n=4).total.flops == 60


def test_value_dependent_ops_say_why_and_take_a_formula():
    """SVD and the eigensolvers iterate until the values converge: no count from shapes. The
    reason says so and names the op to give a formula for; given one, it is counted."""
    svd = analyze(Call(torch.linalg.svdvals), (torch.randn(4, 4),))
    eigh = analyze(Call(torch.linalg.eigvalsh), (torch.randn(4, 4),))
    for report, leaf in ((svd, "aten._linalg_svd.default"), (eigh, "aten._linalg_eigh.default")):
        (uncounted,) = report.uncounted
        assert "iterative" in uncounted.reason and f"formulas={{{leaf}" in uncounted.reason
    estimate = {torch.ops.aten._linalg_svd.default: lambda call: Cost(flops=1_000)}
    counted = analyze(Call(torch.linalg.svdvals), (torch.randn(4, 4),), formulas=estimate)
    assert counted.uncounted == [] and counted.total.flops == 1_000
