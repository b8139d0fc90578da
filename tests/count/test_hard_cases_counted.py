"""The cases other counters get wrong, each counted by hand.

Attention MACs: heads * L * S * (E + Ev) (q.k over E, p.v over Ev, every (query, key) pair).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

from exportflops import analyze


def test_multihead_attention_fast_path_in_eval_under_no_grad():
    """E 16, 4 heads, batch 2, 5 tokens: in_proj 2*5*16*48 = 7,680; attention
    2*4*5*5*(4+4) = 1,600; out_proj 2*5*16*16 = 2,560. Total 11,840 (hook-based counters that
    see only the fused _native_multi_head_attention call report 0)."""
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    with torch.no_grad():
        report = analyze(SelfAttention(), (torch.randn(2, 5, 16),))
    assert report.total.macs == 11_840 and report.uncounted == []


def test_transformer_encoder_layer_fast_path():
    """The MHA above plus the FFN 16 -> 32 -> 16 on 10 tokens: 2 * 10*16*32 = 10,240."""
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    with torch.no_grad():
        report = analyze(layer, (torch.randn(2, 5, 16),))
    assert report.total.macs == 11_840 + 10_240 and report.uncounted == []


class Attention(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.options)


Q = torch.randn(1, 2, 8, 16)


def test_causal_attention_reports_dense_and_causal_effective_work():
    """2 heads, L = S = 8, E = Ev = 16: dense 2*8*8*32 = 4,096 MACs. A top-left causal mask keeps
    8*9/2 = 36 of 64 pairs per head, so 2 * 28 * 32 = 1,792 MACs are masked."""
    report = analyze(Attention(is_causal=True), (Q, Q, Q))
    assert report.total.macs == 4_096
    assert report.total.masked_macs == 1_792


def test_explicit_mask_adds_one_flop_per_score():
    plain = analyze(Attention(), (Q, Q, Q)).total.flops
    masked = analyze(Attention(), (Q, Q, Q, torch.zeros(8, 8))).total.flops
    assert masked - plain == 2 * 8 * 8


def test_grouped_query_attention_counts_every_query_head():
    """4 query heads sharing 2 key/value heads: 4*8*8*(16+16) = 8,192 MACs."""
    q, kv = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    report = analyze(Attention(enable_gqa=True), (q, kv, kv))
    assert report.total.macs == 8_192


def test_flex_attention_is_counted_dense_with_its_score_mod_per_score():
    """Dense 2*8*8*32 = 4,096 MACs; score_mod `score + (q_idx - kv_idx)` is a subtract and an
    add on each of the 2*8*8 = 128 scores."""
    class Flex(nn.Module):
        def forward(self, q, k, v):
            return flex_attention(q, k, v,
                                  score_mod=lambda score, b, h, qi, ki: score + (qi - ki))

    report = analyze(Flex(), (Q, Q, Q))
    assert report.total.macs == 4_096 and report.uncounted == []
    score_mod = [n for n in report.nodes if n.name.startswith("flex_attention.")]
    assert sorted(n.cost.flops for n in score_mod) == [128, 128]


class InPlace(nn.Module):
    """An in-place activation and a buffer updated in forward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x).relu_()


def test_in_place_ops_and_buffer_mutation_are_counted():
    """fc: 2*4*4 = 32 MACs, 64 + 8 bias FLOPs; relu_ 8; the buffer's add 1."""
    report = analyze(InPlace(), (torch.randn(2, 4),))
    assert report.uncounted == []
    assert report.total.flops == 64 + 8 + 8 + 1


def test_bytes_follow_the_dtype():
    """Linear(8, 8) on (2, 8): reads x (16), W (64), b (8) elements, writes 16: x itemsize."""
    for dtype, itemsize in [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)]:
        layer = nn.Linear(8, 8).to(dtype)
        report = analyze(layer, (torch.randn(2, 8, dtype=dtype),))
        assert report.total.bytes_read == (16 + 64 + 8) * itemsize
        assert report.total.bytes_written == 16 * itemsize

    class AddInt8(nn.Module):
        def forward(self, a, b):
            return a + b

    ints = torch.ones(3, 5, dtype=torch.int8)
    report = analyze(AddInt8(), (ints, ints))
    assert (report.total.bytes_read, report.total.bytes_written) == (30, 15)


class _Antialiased(nn.Module):
    def forward(self, x):
        return F.interpolate(x, size=(4, 3), mode="bicubic", antialias=True)


def test_antialiased_resize_blends_every_pixel_under_its_widened_filter():
    # (1, 2, 8, 6) -> (4, 3): scale 2 per dim, so the cubic filter's support widens from 2 to
    # 4 input pixels each side (PyTorch's _compute_index_ranges_weights). Output i reads the
    # inputs from int(2 (i + 0.5) - 4 + 0.5) (at least 0) to int(2 (i + 0.5) + 4 + 0.5) (at
    # most the size), truncated toward zero:
    #   rows (8 -> 4), centers 1, 3, 5, 7: [0, 5), [0, 7), [1, 8), [3, 8): 5 + 7 + 7 + 5 = 24;
    #   cols (6 -> 3), centers 1, 3, 5:    [0, 5), [0, 6), [1, 6):         5 + 6 + 5 = 16.
    # Each output pixel blends rows x cols taps: a multiply each, one add fewer. Summed over
    # the 12 output pixels of each of the 2 channels: 2 x (2 x 24 x 16 - 12) = 1512 FLOPs.
    report = analyze(_Antialiased(), (torch.randn(1, 2, 8, 6),))
    node = next(n for n in report.nodes if n.op == "aten._upsample_bicubic2d_aa.vec")
    assert node.status == "counted" and node.cost.flops == 1512


def test_flat_apply_of_an_index_moves_data_and_of_anything_else_is_not_guessed():
    from exportflops.formulas import FORMULAS
    from exportflops.graph.opcall import OpCall, TensorMeta

    flat_apply = FORMULAS.lookup(torch.ops.higher_order.flat_apply).formula
    ids = TensorMeta((1, 128), torch.int64)
    out = TensorMeta((1, 128), torch.bool)
    # transformers' vmapped mask functions index through dynamo's ModIndex: read the int64
    # ids (1 x 128 x 8 bytes), write the bool mask (128 bytes), no arithmetic.
    index = OpCall(torch.ops.higher_order.flat_apply, {
        "arg0": None, "arg1": None,
        "arg2": "torch._dynamo._trace_wrapped_higher_order_op.ModIndex", "arg3": ids}, (out,))
    cost = flat_apply(index)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 1024, 128)
    other = OpCall(torch.ops.higher_order.flat_apply,
                   {"arg0": None, "arg1": None, "arg2": "mylib.fused", "arg3": ids}, (out,))
    with pytest.raises(ValueError, match="mylib.fused"):
        flat_apply(other)


class _Scans(nn.Module):
    def forward(self, x):
        return x.logcumsumexp(-1) + x.median(-1, keepdim=True).values


def test_a_log_cumulative_sum_and_a_median_are_counted():
    report = analyze(_Scans(), (torch.randn(2, 5),))
    flops = {n.op: n.cost.flops for n in report.nodes}
    # ATen's _log_add_exp_helper per element: min, max, subtract, exp, log1p, add.
    assert flops["aten.logcumsumexp.default"] == 6 * 10
    # A selection, as kthvalue: one compare per element read.
    assert flops["aten.median.dim"] == 10
    assert report.uncounted == []


class _ComplexRotary(nn.Module):
    """Rotary embeddings as complex multiplies (Meta's Llama reference): the backward
    conjugates the rotation, a view that sets the conjugate bit."""

    def forward(self, x):
        rotation = torch.polar(torch.ones(4), torch.arange(4.0))
        return torch.view_as_real(torch.view_as_complex(x) * rotation).flatten(-2)


def test_complex_rotary_embeddings_train_with_every_op_counted():
    report = analyze(_ComplexRotary(), (torch.randn(2, 4, 2, requires_grad=True),),
                     mode="train")
    assert report.uncounted == []
    conjugates = [n for n in report.nodes if n.op == "aten._conj.default"]
    assert conjugates and all(n.status == "zero" for n in conjugates)


class _AntialiasedDefault(nn.Module):
    def forward(self, x):
        return torch.ops.aten._upsample_bilinear2d_aa.default(x, [4, 4], False)


def test_both_overloads_of_an_antialiased_resize_are_counted():
    # The .default overload names its input self, .vec input. 8 -> 4: windows 3, 4, 4, 3 = 14
    # a dim (tests/capture/test_value_branches.py derives them); per channel 14 x 14 multiplies
    # and 16 fewer adds.
    report = analyze(_AntialiasedDefault(), (torch.randn(1, 3, 8, 8),))
    [node] = [n for n in report.nodes if "upsample" in n.op]
    assert node.op.endswith(".default") and node.cost.flops == 3 * (2 * 14 * 14 - 16)


class _SparseTimesWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 5))

    def forward(self, x):
        return x @ self.weight, x.to_dense() @ self.weight


def test_sparse_operand_is_not_counted_dense():
    """A 3 x 4 matrix holding one nonzero times a 4 x 5 weight: the sparse kernel does 5 MACs
    (one per output column for the one nonzero), the dense count is 3*4*5 = 60. No shape holds
    the 5, so the sparse matmul is uncounted, naming the 120 dense FLOPs it is not; the same
    matrix made dense first is counted at 60 MACs, and its to_dense at none."""
    x = torch.zeros(3, 4)
    x[0, 0] = 1.0
    report = analyze(_SparseTimesWeight(), (x.to_sparse(),))
    assert report.total.macs == 60
    [uncounted] = report.uncounted
    assert "sparse" in uncounted.reason and "120 FLOPs" in uncounted.reason


def test_a_users_formula_counts_a_sparse_operand():
    """A formula given for the op is used as given on a sparse tensor: here 1 MAC per stored
    nonzero per output column, 1 * 5 = 5 (the caller knows its one nonzero); the dense
    matmul beside it 3 * 4 * 5 = 60."""
    from exportflops import Cost

    def nonzeros_times_columns(call):
        macs = 5 if call.args["self"].layout == torch.sparse_coo else 60
        return Cost(flops=2 * macs, macs=macs)

    x = torch.zeros(3, 4)
    x[0, 0] = 1.0
    report = analyze(_SparseTimesWeight(), (x.to_sparse(),),
                     formulas={torch.ops.aten.matmul.default: nonzeros_times_columns})
    assert report.uncounted == [] and report.total.macs == 5 + 60


class _QuantizedMatmul(nn.Module):
    """Activations (17, 64) times a weight of 48 outputs, through one of torch's quantized
    kernels."""

    def __init__(self, kernel: str):
        super().__init__()
        self.kernel = kernel
        self.int8 = torch.randint(-8, 8, (48, 64), dtype=torch.int8)
        self.scales = torch.rand(48)
        self.int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.randint(0, 16, (48, 64), dtype=torch.int32), 1)
        self.scales_and_zeros = torch.rand(64 // 32, 48, 2)

    def forward(self, x):
        if self.kernel == "int_mm":
            return torch._int_mm(x, self.int8.T.contiguous())
        if self.kernel == "int8pack":
            return torch.ops.aten._weight_int8pack_mm(x, self.int8, self.scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.int4, 32,
                                                          self.scales_and_zeros)


@pytest.mark.parametrize("kernel, flops", [
    ("int_mm", 2 * 52_224),                    # int8 x int8 -> int32, nothing else
    ("int8pack", 2 * 52_224 + 17 * 48),        # + one scale multiply per output
    ("int4pack", 2 * 52_224 + 2 * 48 * 64),    # + a scale and a zero per weight element
])
def test_quantized_matmul_kernels(kernel, flops):
    """torchao's int8 dynamic and int8/int4 weight-only paths: 17 * 48 * 64 = 52,224 MACs,
    whatever layout the weight is packed in (the int4 weight's shape is the kernel's tiles)."""
    x = (torch.randint(-8, 8, (17, 64), dtype=torch.int8) if kernel == "int_mm"
         else torch.randn(17, 64))
    report = analyze(_QuantizedMatmul(kernel), (x,))
    assert report.uncounted == []
    assert (report.total.macs, report.total.flops) == (52_224, flops)


def test_scaled_grouped_mm_counts_each_row_once():
    """torchtitan's float8 MoE: 64 rows of width 32 split among 4 experts of 48 outputs by
    ``offs``: each row meets one expert's weight, 64 * 32 * 48 = 98,304 MACs (on meta: the
    kernel runs on sm90+ only)."""
    class ScaledGrouped(nn.Module):
        def forward(self, x, w, scale_a, scale_b, offs):
            return torch.ops.aten._scaled_grouped_mm(x, w, scale_a, scale_b, offs=offs,
                                                     out_dtype=torch.bfloat16)

    fp8 = torch.float8_e4m3fn
    x = torch.empty(64, 32, dtype=fp8, device="meta")
    w = torch.empty(4, 48, 32, dtype=fp8, device="meta").transpose(-2, -1)
    scales = (torch.empty(64, device="meta"), torch.empty(4, 48, device="meta"))
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    report = analyze(ScaledGrouped(), (x, w, *scales, offs))
    assert report.uncounted == [] and report.total.macs == 98_304


def test_overrideable_fused_attention_is_attention():
    """The SDPA backend a third-party device registers: batch 2, 4 heads, 16 queries and keys
    of width 8: 2*4*16*16*(8+8) = 32,768 MACs, as for every SDPA kernel."""
    class Overrideable(nn.Module):
        def forward(self, q, k, v):
            return torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v)[0]

    q = torch.empty(2, 4, 16, 8, device="meta")
    report = analyze(Overrideable(), (q, q, q))
    assert report.uncounted == [] and report.total.macs == 32_768
