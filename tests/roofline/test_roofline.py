"""Bytes by kind, arithmetic intensity and the roofline, against numbers derived by hand.

Device figures are the datasheets' (exportflops/device_table.py cites each row):
- H100 SXM: FP32 67 TFLOP/s; BF16 printed "1,979 teraFLOPS*" with sparsity, dense 989.5;
  memory bandwidth 3.35 TB/s.
- A100 SXM4 80GB: FP32 19.5 TFLOP/s; BF16 "312 TF | 624 TF*", dense 312; bandwidth 2,039 GB/s.
A roofline predicts max(FLOPs / peak, bytes / bandwidth) per node (Williams et al. 2009).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.cli import main
from exportflops.errors import RooflineError, UnknownDeviceError
from exportflops.examples.gpt2 import gpt2
from exportflops.records import Roofline
from exportflops.roofline import roofline as roofline_of

TERA = 1e12
H100_SXM = {"float32": 67 * TERA, "bfloat16": 1979 / 2 * TERA, "bandwidth": 3.35e12}
A100_SXM_80GB = {"float32": 19.5 * TERA, "bfloat16": 312 * TERA, "bandwidth": 2039e9}
DEVICES = {"h100-sxm": H100_SXM, "a100-sxm-80gb": A100_SXM_80GB}
ITEMSIZE = {torch.float32: 4, torch.bfloat16: 2}


def _linear(batch: int, width: int, dtype: torch.dtype):
    with torch.device("meta"):
        model = nn.Linear(width, width, bias=False).to(dtype)
        x = torch.zeros(batch, width, dtype=dtype)
    return analyze(model, (x,))


# (batch, width): a square 4096 matmul is compute-bound, one row through the same weight is not.
SHAPES = {"compute": (4096, 4096), "memory": (1, 4096)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bound", SHAPES)
def test_a_linear_is_predicted_from_its_flops_bytes_and_the_datasheet(device, dtype, bound):
    batch, width = SHAPES[bound]
    report = _linear(batch, width, dtype)
    size = ITEMSIZE[dtype]
    # 1. FLOPs: batch x width x width multiply-accumulates, 2 FLOPs each (no bias).
    flops = 2 * batch * width * width
    # 2. Bytes: x read (batch x width), the weight read (width x width), y written (batch x width).
    weight, x, y = width * width * size, batch * width * size, batch * width * size
    assert report.total.weight_bytes_read == weight
    assert report.total.activation_bytes_read == x
    assert report.total.activation_bytes_written == y
    assert report.total.bytes_read + report.total.bytes_written == weight + x + y
    # 3. Times at the datasheet's dense peak (float32 without TF32: torch's default) and bandwidth.
    roofs = DEVICES[device]
    peak = roofs["float32" if dtype == torch.float32 else "bfloat16"]
    compute_s, memory_s = flops / peak, (weight + x + y) / roofs["bandwidth"]
    # 4. Which one bounds it: 4096^3 x 2 FLOPs over 3 x 4096^2 x size bytes is 2731 / size
    #    FLOP/B, above every ridge (at most 295 FLOP/B: 989.5e12 / 3.35e12); one row is
    #    2 x 4096^2 FLOPs over (4096^2 + 2 x 4096) x size bytes, under 2 / size FLOP/B.
    assert (compute_s > memory_s) == (bound == "compute")

    roofline = roofline_of(report, device=device)
    (node,) = roofline.nodes
    assert node.name == "linear" and node.bound == bound
    assert node.intensity == pytest.approx(flops / (weight + x + y), rel=1e-12)
    assert node.ridge_point == pytest.approx(peak / roofs["bandwidth"], rel=1e-12)
    assert node.predicted_s == pytest.approx(max(compute_s, memory_s), rel=1e-12)
    assert roofline.total.predicted_s == pytest.approx(max(compute_s, memory_s), rel=1e-12)
    assert roofline.total.bound == bound


def test_tf32_takes_float32_contractions_at_the_tensor_core_peak():
    report = _linear(4096, 4096, torch.float32)
    # H100 SXM TF32 printed "989 teraFLOPS*" with sparsity: dense 494.5.
    node = roofline_of(report, device="h100-sxm", tf32=True).nodes[0]
    assert node.dtype == "tf32"
    assert node.predicted_s == pytest.approx(2 * 4096**3 / (989 / 2 * TERA), rel=1e-12)


@pytest.fixture(scope="module")
def gpt2_report():
    model, args = gpt2("meta", seq_len=64)
    return analyze(model, args)


# nanoGPT GPT-2 124M: n_embd 768, 12 layers, MLP 4 x 768, biases, vocab 50304, tied head.
D, LAYERS, VOCAB, T = 768, 12, 50304, 64
PER_BLOCK = (2 * D            # ln_1 weight and bias
             + D * 3 * D + 3 * D  # attn.c_attn
             + D * D + D          # attn.c_proj
             + 2 * D              # ln_2
             + D * 4 * D + 4 * D  # mlp.c_fc
             + 4 * D * D + D)     # mlp.c_proj


def test_gpt2_reads_each_weight_once_per_use_and_the_tied_head_where_it_is_used(gpt2_report):
    fp32 = 4
    # Each use reads: T rows of wte and of wpe (embeddings gather the rows they need); every
    # block's parameters once; ln_f; the head's full 50304 x 768 matrix, the same tensor as wte
    # (tied), read again where the head uses it; and the 8-byte int64 constant tensor([-1]) that
    # x[:, [-1], :] indexes with (a lifted constant: a weight of the graph, not a parameter).
    weight = fp32 * (2 * T * D + LAYERS * PER_BLOCK + 2 * D + VOCAB * D) + 8
    assert PER_BLOCK == 7_087_872
    assert gpt2_report.total.weight_bytes_read == weight
    assert gpt2_report.module("lm_head").inclusive.weight_bytes_read == fp32 * VOCAB * D
    assert gpt2_report.module("transformer.wte").inclusive.weight_bytes_read == fp32 * T * D
    assert gpt2_report.module("transformer.h.0").inclusive.weight_bytes_read == fp32 * PER_BLOCK
    assert gpt2_report.total.state_bytes_read == gpt2_report.total.state_bytes_written == 0


def test_the_kinds_add_up_to_the_bytes_everywhere_and_none_is_negative(gpt2_report):
    costs = ([n.cost for n in gpt2_report.nodes] + [m.inclusive for m in gpt2_report.modules]
             + [s.cost for s in gpt2_report.operators.values()] + [gpt2_report.total])
    for cost in costs:
        parts = (cost.weight_bytes_read, cost.activation_bytes_read, cost.state_bytes_read,
                 cost.activation_bytes_written, cost.state_bytes_written)
        assert min(parts) >= 0
        assert sum(parts) == cost.bytes_read + cost.bytes_written


class Cache(nn.Module):
    """One decode step's cache write: a (4, 8) float32 buffer, one row written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x, position):
        self.cache[position] = self.proj(x)
        return self.cache.sum(0)


def test_a_buffer_written_in_place_is_state_read_and_written():
    report = analyze(Cache(), (torch.randn(1, 8), torch.tensor([1])))
    put = next(n for n in report.nodes if n.op.startswith("aten.index_put"))
    cache = 4 * 8 * 4  # the whole buffer, float32 (an in-place op counted as its twin)
    assert put.cost.state_bytes_read == cache and put.cost.state_bytes_written == cache
    assert put.cost.activation_bytes_read == 8 + 8 * 4  # int64 position, the new row
    (reduce,) = [n for n in report.nodes if n.op == "aten.sum.dim_IntList"]
    assert reduce.cost.state_bytes_read == cache  # the cache read back after the write
    # The projection's weight and bias are weights, never state.
    assert report.module("proj").inclusive.weight_bytes_read == (8 * 8 + 8) * 4


class NoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        with torch.no_grad():  # exported as a wrapper whose subgraph takes the weight
            y = self.lin(x)
        return y + 1


class Branch(NoGrad):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x), lambda x: x.clone(), (x,))


@pytest.mark.parametrize("model", [NoGrad, Branch], ids=["no_grad", "cond"])
def test_a_weight_passed_into_a_subgraph_is_still_a_weight(model):
    report = analyze(model(), (torch.randn(2, 8),))
    (linear,) = [n for n in report.nodes if n.op == "aten.linear.default"]
    assert linear.cost.weight_bytes_read == 8 * 8 * 4  # the (8, 8) float32 weight
    assert linear.cost.activation_bytes_read == 2 * 8 * 4  # x


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_step_is_memory_bound(device):
    # Batch 1, one token: every linear reads its whole weight (4 bytes per fp32 element) for 2
    # FLOPs per element, so the model's intensity is about 2 / 4 = 0.5 FLOP/B, far under the
    # float32 ridge (67e12 / 3.35e12 = 20 FLOP/B on H100 SXM; 19.5e12 / 2.039e12 = 9.6 on A100).
    model, args = gpt2("meta", seq_len=1)
    roofline = roofline_of(analyze(model, args), device=device)
    assert roofline.total.bound == "memory"
    assert 0.45 < roofline.total.intensity < 0.55
    linears = [n for n in roofline.nodes if n.op == "aten.linear.default"]
    assert len(linears) == 4 * LAYERS + 1 and all(n.bound == "memory" for n in linears)


def test_a_module_predicts_the_sum_of_its_nodes(gpt2_report):
    roofline = roofline_of(gpt2_report, device="h100-sxm")
    block = next(m for m in roofline.modules if m.path == "transformer.h.3")
    inside = [n for n in roofline.nodes if n.module.startswith("transformer.h.3.")
              or n.module == "transformer.h.3"]
    assert block.predicted_s == pytest.approx(sum(n.predicted_s for n in inside), rel=1e-12)
    assert roofline.total.predicted_s == pytest.approx(
        sum(n.predicted_s for n in roofline.nodes), rel=1e-12)


def test_the_roofline_round_trips_through_json(gpt2_report):
    roofline = roofline_of(gpt2_report, device="a100-sxm-80gb")
    assert Roofline.model_validate_json(roofline.model_dump_json()) == roofline
    plain = json.loads(roofline.model_dump_json())
    assert {"name", "intensity", "bound", "predicted_s"} <= set(plain["nodes"][0])
    assert plain["total"]["predicted_s"] > 0


def test_an_unknown_device_key_is_refused_with_the_known_keys():
    with pytest.raises(UnknownDeviceError, match="h100-sxm.*a100-sxm-80gb|a100-sxm-80gb.*h100"):
        roofline_of(_linear(1, 8, torch.float32), device="h100")


def test_a_contraction_dtype_the_device_lacks_names_the_node():
    # Volta (V100) has no bfloat16 tensor cores: its row lists no bfloat16 peak.
    with pytest.raises(UnknownDeviceError, match="'linear'.*bfloat16.*v100-sxm2"):
        roofline_of(_linear(1, 8, torch.bfloat16), device="v100-sxm2")


def test_a_report_of_dynamic_sizes_must_be_evaluated_first():
    from torch.export import Dim

    model = nn.Linear(8, 8)
    report = analyze(model, (torch.zeros(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    with pytest.raises(RooflineError, match="evaluate"):
        roofline_of(report, device="h100-sxm")
    assert roofline_of(report.evaluate(batch=4), device="h100-sxm").nodes


def test_the_cpu_is_measured_and_a_profiled_report_shows_the_efficiency():
    from exportflops import profile

    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU())
    with torch.no_grad():
        report = profile(model, (torch.randn(64, 256),), warmup=1, repeat=3)
    roofline = roofline_of(report, device="cpu")
    assert roofline.source.startswith("measured on this CPU")
    assert roofline.measured_on == report.runtime.device
    medians = {t.name: t.latency.median_s for t in report.runtime.nodes}
    for node in roofline.nodes:
        if node.name in medians:
            assert node.measured_s == medians[node.name]
            assert node.efficiency == pytest.approx(node.predicted_s / node.measured_s)


def test_the_command_adds_the_roofline_view(capsys):
    assert main(["gpt2", "--input", "1,1:int64", "--device-model", "h100-sxm",
                 "--view", "summary"]) == 0
    text = capsys.readouterr().out
    assert "Roofline on h100-sxm" in text and "memory-bound" in text
    assert main(["gpt2", "--input", "1,1:int64", "--device-model", "h100-sxm",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["roofline"]["device"] == "h100-sxm" and out["roofline"]["total"]["bound"] == "memory"
    assert main(["gpt2", "--device-model", "h100"]) == 2
    assert "a100-sxm-80gb" in capsys.readouterr().err


class _ViewOrCopy(nn.Module):
    """GQA's repeat_kv (expand 2 key heads to 6, reshape), a reshape that can view, and a
    transpose made contiguous."""

    def forward(self, kv):  # (batch 2, kv heads 2, seq 5, head dim 8), float32
        b, h, s, d = kv.shape
        repeated = kv[:, :, None].expand(b, h, 3, s, d).reshape(b, h * 3, s, d)
        return repeated, kv.reshape(b, h * s, d), kv.transpose(1, 2).contiguous()


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_reshape_copies_only_when_it_cannot_view(mode):
    kv = torch.zeros(2, 2, 5, 8, requires_grad=mode == "train")
    nodes = {n.name: n for n in analyze(_ViewOrCopy(), (kv,), mode=mode).nodes
             if n.phase == "forward"}
    stored = 2 * 2 * 5 * 8 * 4  # kv: 640 bytes
    # The expanded view (stride 0 over the 3 repeats) cannot be viewed as 6 heads: a copy that
    # reads the 640 stored bytes, not the 1920 the expanded shape spans, and writes 6 heads.
    repeat = nodes["reshape"]
    assert (repeat.cost.bytes_read, repeat.cost.bytes_written) == (stored, 3 * stored)
    assert repeat.status == "zero" and repeat.cost.flops == 0
    # Merging contiguous dims views kv: no byte moves.
    assert (nodes["reshape_1"].cost.bytes_read, nodes["reshape_1"].cost.bytes_written) == (0, 0)
    # A transposed view made contiguous is a copy of all of it.
    copy = nodes["contiguous"]
    assert (copy.cost.bytes_read, copy.cost.bytes_written) == (stored, stored)
