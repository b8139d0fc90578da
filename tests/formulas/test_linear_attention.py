"""Triangular solves, and the gated delta rule of Hugging Face's linear-attention layers (Qwen3.5,
OLMo-Hybrid, and the MiniCPM-V / -OCR models built on Qwen3.5's text model).

transformers 5's ``torch_chunk_gated_delta_rule`` takes one branch in eager and another under
torch.export (``is_torchdynamo_exporting()``). Eager solves the chunk's unit-lower-triangular
system with ``torch.linalg.solve_triangular`` (twice: for the values and for the decayed keys);
export builds the system's inverse by forward substitution (elementwise multiplies and sums) and
multiplies it in as two dense (C x C) @ (C x d) matmuls. torch's FlopCounterMode has no formula
for the solve, so eager FlopCounterMode misses those two products and reads lower than us by
exactly B H N C^2 (d_k + d_v) MACs per layer; on the exported graph it agrees with us exactly.
Every expected number is derived by hand below from the function's source (transformers
models/qwen3_5/modeling_qwen3_5.py, torch_chunk_gated_delta_rule).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from exportflops import analyze


class Solve(torch.nn.Module):
    def forward(self, a, b):
        return (torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
                torch.linalg.solve_triangular(a, b.mT, upper=True, left=False),
                torch.triangular_solve(b, a, upper=False).solution)


def test_a_triangular_solve_is_n_n_minus_1_over_2_macs_per_right_hand_side():
    # A: 2 x (8 x 8), B: 2 x (8 x 3). Forward substitution: row i of one right-hand side takes
    # i - 1 MACs, 0 + 1 + ... + 7 = 28 per side; 2 batches x 3 sides = 6 sides: 168 MACs. A
    # general triangle also divides each of the 2 x 8 x 3 = 48 unknowns by its diagonal entry:
    # 2 x 168 + 48 = 384 FLOPs (= n^2 k per system, LAPACK's trsm count); unitriangular: 336.
    report = analyze(Solve(), (torch.randn(2, 8, 8), torch.randn(2, 8, 3)), {})
    solves = [n for n in report.nodes if "solve" in n.op]
    assert [n.status for n in solves] == ["counted"] * 3
    assert [n.cost.macs for n in solves] == [168, 168, 168]
    assert [n.cost.flops for n in solves] == [336, 384, 384]
    assert report.uncounted == []


# The gated delta rule on tiny shapes: batch 1, 6 tokens, 1 key head serving 2 value heads
# (queries and keys are repeated to H = 2 heads), d_k = 3, d_v = 5, chunks of C = 4: the 6
# tokens are padded to 8, N = 2 chunks.
B, T, HK, H, DK, DV, C = 1, 6, 1, 2, 3, 5, 4
N = 2
# Per head and chunk, in source order:
#   k_beta @ key^T (C C d_k) 48, query @ key^T (C C d_k) 48,
#   export only: ut_system @ v_beta (C C d_v) 80, ut_system @ decayed_k_beta (C C d_k) 48;
#   the scan: k_cumdecay @ state (C d_k d_v) 60, query @ state (C d_k d_v) 60,
#   intra_chunk_attn @ v_new (C C d_v) 80, key^T @ v_new (d_k C d_v) 60.
EXPORT_ONLY = B * H * N * (80 + 48)  # 512: the two dense products of the inverse
EXPORT_MACS = B * H * N * (48 + 48 + 80 + 48 + 60 + 60 + 80 + 60)  # 1936
EAGER_MATMUL_MACS = EXPORT_MACS - EXPORT_ONLY  # 1424: what FlopCounterMode sees in eager
# Eager's two unit-triangular solves, per head and chunk: C (d_v + d_k) = 32 unknowns, each
# (C - 1) / 2 = 1.5 MACs on average (0 + 1 + 2 + 3 over the 4 rows): 48, so 192 in all.
EAGER_SOLVE_MACS = B * H * N * C * (DV + DK) * (C - 1) // 2


class GatedDeltaRule(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, q, k, v, g, beta):
        return self.module.torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=C)[0]


@pytest.fixture(name="rule")
def _rule():
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    torch.manual_seed(0)
    inputs = (torch.randn(B, T, HK, DK), torch.randn(B, T, HK, DK), torch.randn(B, T, H, DV),
              -torch.rand(B, T, H), torch.rand(B, T, H))
    return modeling, GatedDeltaRule(modeling), inputs


def test_the_exported_gated_delta_rule_counts_the_two_dense_products_of_its_inverse(rule):
    _, model, inputs = rule
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(model, inputs, {})
    assert report.total.macs == EXPORT_MACS
    assert report.uncounted == []


def test_eager_flop_counter_misses_the_solves_so_it_reads_the_dense_products_lower(rule):
    """The explanation of the survey's gap: eager runs solve_triangular (no torch formula)."""
    _, model, inputs = rule
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    assert counter.get_total_flops() == 2 * EAGER_MATMUL_MACS


def test_the_eager_branch_exported_counts_its_solves(rule, monkeypatch):
    """The same function made to take eager's branch under export: its graph holds the two
    solve_triangular calls, and we count them instead of the dense products."""
    modeling, model, inputs = rule
    monkeypatch.setattr(modeling, "is_torchdynamo_exporting", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(model, inputs, {})
    assert sum(s.calls for op, s in report.operators.items() if "solve_triangular" in op) == 2
    assert report.total.macs == EAGER_MATMUL_MACS + EAGER_SOLVE_MACS
