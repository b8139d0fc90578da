"""analyze(): counts derived by hand, attribution invariants, custom ops, strictness, errors."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import exportflops
from exportflops import Cost, ExportError, Report, UncountedOpError, analyze, register_formula
from exportflops.attribution import parent
from exportflops.examples.gpt2 import gpt2
from exportflops.errors import DuplicateFormulaError
from exportflops.formulas import FORMULAS, FormulaTable
from tests.models import SharedLayer, SmallConvNet, TwoLayerMLP


@pytest.fixture(scope="module")
def shared_report():
    return analyze(SharedLayer(d=16), (torch.randn(4, 16),))


@pytest.fixture(scope="module")
def conv_report():
    return analyze(SmallConvNet(), (torch.randn(2, 3, 8, 8),))


def test_a_module_called_twice_is_charged_twice_and_counts_two_calls(shared_report):
    # Linear(16, 16) on 4 rows: 4*16*16 = 1024 MACs, 2*1024 + 4*16 (bias) = 2112 FLOPs per call.
    shared = shared_report.module("shared")
    assert shared.calls == 2
    assert shared.inclusive.macs == 2 * 1024
    assert shared.inclusive.flops == 2 * 2112


def test_functional_ops_are_charged_to_the_module_that_runs_them(shared_report):
    # x (4,16) @ x.T... : other(y) (4,16) @ x.T (16,4): 4*4*16 = 256 MACs, run by the root.
    assert shared_report.module("").exclusive.macs == 256
    # shared 2048 + other (no bias) 1024 + root matmul 256
    assert shared_report.total.macs == 2048 + 1024 + 256
    assert shared_report.total.flops == 2 * 2112 + 2 * 1024 + 2 * 256


def test_tied_weights_are_counted_once_and_named(shared_report):
    # shared.weight 16*16 + shared.bias 16; other.weight is the same tensor.
    assert shared_report.params == 16 * 16 + 16
    assert shared_report.module("other").params == 0
    assert shared_report.module("other").tied_params == ["weight"]
    assert [(t.name, t.counted_as) for t in shared_report.tied_parameters] == [
        ("other.weight", "shared.weight")]


def test_conv_family_macs_by_hand(conv_report):
    # conv 3->8, k3, pad 1 on 8x8: 2*8*8*8 outputs x 3*9 weights each = 27,648
    # depthwise 8 groups: 2*8*8*8 outputs x 1*9 = 9,216
    # transposed 8->4, k2, s2 on the 4x4 pooled map: 2*8*4*4 inputs x 4*2*2 = 4,096
    # fc 4 -> 10 on 2 rows: 80
    assert conv_report.module("conv").inclusive.macs == 27_648
    assert conv_report.module("depthwise").inclusive.macs == 9_216
    assert conv_report.module("up").inclusive.macs == 4_096
    assert conv_report.total.macs == 27_648 + 9_216 + 4_096 + 80


def test_adaptive_and_max_pool_by_hand(conv_report):
    # AdaptiveAvgPool2d(1) over (2, 4, 8, 8): 64 window elements per output: 2*4*64 adds+divide.
    assert conv_report.module("pool").inclusive.flops == 2 * 4 * 64
    # max_pool2d(2) on (2, 8, 8, 8) -> (2, 8, 4, 4): 3 compares per output, in the root.
    maxpool = [n for n in conv_report.nodes if n.op.startswith("aten.max_pool2d")]
    assert [n.cost.flops for n in maxpool] == [2 * 8 * 4 * 4 * 3]


@pytest.mark.parametrize("q_len, kv_len, kept", [
    (3, 5, 1 + 2 + 3),  # row i keeps keys 0..i
    (5, 3, 1 + 2 + 3 + 3 + 3),  # rows past the last key keep all 3
    (4, 4, 4 * 5 // 2),
], ids=["short-query", "long-query", "square"])
def test_causal_attention_reports_the_unmasked_work(q_len, kv_len, kept):
    class Attention(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    qk, dv = 2, 4
    args = (torch.randn(1, 1, q_len, qk), torch.randn(1, 1, kv_len, qk),
            torch.randn(1, 1, kv_len, dv))
    report = analyze(Attention(), args)
    assert report.total.macs == q_len * kv_len * (qk + dv)
    assert report.total.masked_macs == (q_len * kv_len - kept) * (qk + dv)
    assert 0 < report.total.causal_effective_flops < report.total.flops


@pytest.mark.parametrize("dtype, itemsize", [(torch.float32, 4), (torch.bfloat16, 2),
                                             (torch.float16, 2)], ids=str)
def test_bytes_follow_the_dtype(dtype, itemsize):
    model = nn.Linear(8, 8).to(dtype)
    report = analyze(model, (torch.randn(4, 8, dtype=dtype),))
    # reads input 4*8, weight 8*8, bias 8; writes 4*8 elements
    assert report.total.bytes_read == (32 + 64 + 8) * itemsize
    assert report.total.bytes_written == 32 * itemsize


def _children(report: Report, path: str):
    return [m for m in report.modules if m.path != "" and parent(m.path) == path and m.path != path]


@pytest.mark.parametrize("build", [
    lambda: (SharedLayer(), (torch.randn(3, 16),)),
    lambda: (SmallConvNet(), (torch.randn(1, 3, 8, 8),)),
    lambda: gpt2("meta", seq_len=32),
], ids=["shared", "convnet", "gpt2"])
def test_inclusive_is_exclusive_plus_children_and_root_is_the_sum_of_nodes(build):
    report = analyze(*build())
    for module in report.modules:
        expected = sum((c.inclusive for c in _children(report, module.path)), module.exclusive)
        assert module.inclusive == expected, module.path
    assert report.total == sum((n.cost for n in report.nodes), Cost())
    assert report.module("").inclusive == report.total
    assert sum(s.cost.flops for s in report.operators.values()) == report.total.flops


@pytest.mark.parametrize("build", [
    lambda: gpt2("meta", seq_len=64),
    lambda: (SmallConvNet(), (torch.randn(1, 3, 8, 8),)),
], ids=["gpt2", "convnet"])
def test_core_aten_after_run_decompositions_counts_the_same_matmul_work(build):
    model, args = build()
    program = torch.export.export(model, args)
    decomposed = analyze(program.run_decompositions())
    assert decomposed.uncounted == []
    assert decomposed.total.matmul_flops == analyze(program).total.matmul_flops


# --- custom ops: uncounted until the user gives a formula -----------------------------------

@torch.library.custom_op("exportflops_test::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * x + y


@scale_add.register_fake
def _(x, y):
    return torch.empty_like(x)


class UsesCustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return scale_add(self.inner(x), x)


def _scale_add_cost(call):
    return call.cost(flops=2 * call.out.numel)  # one multiply, one add per element


def test_an_op_without_formula_is_reported_by_name_and_module():
    report = analyze(UsesCustomOp(), (torch.randn(3, 4),))
    [uncounted] = report.uncounted
    assert uncounted.op == "exportflops_test.scale_add.default"
    assert uncounted.calls == 1 and uncounted.modules == [""]
    assert uncounted.reason == "no formula"
    assert report.coverage < 1.0


def test_strict_raises_naming_node_module_and_op():
    with pytest.raises(UncountedOpError,
                       match=r"exportflops_test\.scale_add\.default.*node 'scale_add'"):
        analyze(UsesCustomOp(), (torch.randn(3, 4),), strict=True)


def test_a_per_call_formula_counts_the_custom_op():
    report = analyze(UsesCustomOp(), (torch.randn(3, 4),),
                     formulas={torch.ops.exportflops_test.scale_add: _scale_add_cost})
    assert report.uncounted == []
    # Linear(4,4) on 3 rows: 2*3*4*4 + 3*4 bias; scale_add: 2 * 12
    assert report.total.flops == 2 * 48 + 12 + 24


def test_a_globally_registered_formula_counts_the_custom_op_and_can_be_removed():
    op = torch.ops.exportflops_test.scale_add.default
    register_formula(op)(_scale_add_cost)
    try:
        assert analyze(UsesCustomOp(), (torch.randn(3, 4),)).uncounted == []
        with pytest.raises(DuplicateFormulaError, match="replace=True"):
            register_formula(op)(_scale_add_cost)
    finally:
        FORMULAS.remove(op)
    assert len(analyze(UsesCustomOp(), (torch.randn(3, 4),)).uncounted) == 1


def test_a_formula_that_raises_names_the_node_and_keeps_the_rest():
    def broken(call):
        raise ValueError("cannot count this layout")

    report = analyze(UsesCustomOp(), (torch.randn(3, 4),),
                     formulas={torch.ops.aten.linear: broken,
                               torch.ops.exportflops_test.scale_add: _scale_add_cost})
    [failed] = report.uncounted
    assert failed.op == "aten.linear.default" and failed.modules == ["inner"]
    assert "cannot count this layout" in failed.reason
    assert report.total.flops == 24  # scale_add still counted


def test_a_table_passed_whole_replaces_the_defaults():
    report = analyze(TwoLayerMLP(), (torch.randn(2, 32),), formulas=FormulaTable())
    assert report.total.flops == 0 and {u.op for u in report.uncounted} >= {"aten.linear.default"}


# --- inputs other than a module, and errors -------------------------------------------------

def test_an_exported_program_and_a_saved_one_give_the_same_counts(tmp_path):
    model, args = TwoLayerMLP(), (torch.randn(2, 32),)
    program = torch.export.export(model, args)
    path = tmp_path / "mlp.pt2"
    torch.export.save(program, path)
    direct, from_program, from_file = analyze(model, args), analyze(program), analyze(str(path))
    assert direct.total == from_program.total == from_file.total
    assert from_file.model == str(path)
    assert [m.path for m in from_file.modules] == [m.path for m in direct.modules]


def test_a_non_module_is_a_type_error():
    with pytest.raises(TypeError, match="nn.Module, a torch.export.ExportedProgram or the path"):
        analyze(42, ())


def test_args_that_are_not_a_tuple_are_a_type_error():
    with pytest.raises(TypeError, match="args must be a tuple"):
        analyze(TwoLayerMLP(), {"x": 1})


def test_args_that_do_not_match_forward_name_the_model_and_hint():
    with pytest.raises(ExportError, match="TwoLayerMLP") as info:
        analyze(TwoLayerMLP(), (torch.randn(2, 32), torch.randn(2, 32)))
    assert "signature" in info.value.hint


def test_data_dependent_control_flow_hints_at_torch_cond():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    # On meta: with values, the example's decide the branch (tests/capture/test_value_branches.py).
    with pytest.raises(ExportError, match="Branchy") as info:
        analyze(Branchy(), (torch.randn(3, device="meta"),))
    assert "torch.cond" in info.value.hint
    assert info.value.torch_message


def test_a_missing_saved_program_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="torch.export.save"):
        analyze(str(tmp_path / "nope.pt2"))


def test_a_file_that_is_not_a_program_says_so(tmp_path):
    path = tmp_path / "junk.pt2"
    path.write_text("not a program")
    with pytest.raises(ValueError, match="not a program saved with torch.export.save"):
        analyze(str(path))


def test_formulas_of_the_wrong_type_are_a_type_error():
    with pytest.raises(TypeError, match="formulas must be"):
        analyze(TwoLayerMLP(), (torch.randn(2, 32),), formulas=[1])


# --- the report as data ---------------------------------------------------------------------

def test_report_round_trips_through_json(shared_report, conv_report):
    for report in (shared_report, conv_report):
        assert Report.model_validate_json(report.model_dump_json()) == report


def test_report_records_what_reproduces_it(conv_report):
    assert conv_report.model == "SmallConvNet"
    assert [(i.shape, i.dtype) for i in conv_report.inputs] == [([2, 3, 8, 8], "float32")]
    assert conv_report.torch_version == torch.__version__
    assert conv_report.exportflops_version == exportflops.__version__
    assert conv_report.module("").type == "tests.models.SmallConvNet"


@torch.library.custom_op("exportflops_tests::split_halves", mutates_args=())
def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[:, :4].clone(), x[:, 4:].clone()


@split_halves.register_fake
def _(x):
    return x.new_empty(x.shape[0], 4), x.new_empty(x.shape[0], 4)


class TwoOutputsUncounted(nn.Module):
    """Like an LSTM without a formula: one uncounted op whose outputs free getitem nodes read."""

    def forward(self, x):
        first, second = split_halves(x)
        return first, second


def test_coverage_is_the_counted_share_of_the_arithmetic_nodes_not_of_all_nodes():
    # The graph: split_halves (uncounted) and two getitem (free). All its arithmetic is
    # uncounted, so coverage is 0 / 1 = 0%, not the 2 / 3 of all nodes that are not uncounted.
    report = analyze(TwoOutputsUncounted(), (torch.randn(2, 8),))
    assert [n.status for n in report.nodes].count("zero") == 2
    assert report.coverage == 0.0
    summary = exportflops.flops_report(report, view="summary")
    assert "of 1 arithmetic nodes; 2 free ones left out" in summary
