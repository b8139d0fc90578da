"""Every way of holding analyze() wrong ends in an error that says what to do next.

(test_core.py has: a non-module argument, args that are not a tuple, too many args, a model
branching on a tensor's value (hint), a missing path, a text file as a program, a wrong
`formulas` type, and a formula that raises when not strict.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops import ExportError, UncountedOpError, analyze
from exportflops.formulas.matmul import linear
from tests.models import TwoLayerMLP

X = torch.randn(2, 32)


def test_a_model_class_instead_of_an_instance_says_to_instantiate_it():
    with pytest.raises(TypeError, match=r"got the class TwoLayerMLP: pass TwoLayerMLP\(\.\.\.\)"):
        analyze(TwoLayerMLP, (X,))


@pytest.mark.parametrize(("args", "kwargs", "torch_says"), [
    ((), None, "missing a required argument: 'x'"),
    ((X,), {"scale": 2.0}, "unexpected keyword argument 'scale'"),
], ids=["missing-arg", "unknown-kwarg"])
def test_inputs_that_do_not_fit_forwards_signature(args, kwargs, torch_says):
    with pytest.raises(ExportError, match="could not capture TwoLayerMLP") as error:
        analyze(TwoLayerMLP(), args, kwargs)
    assert torch_says in error.value.torch_message
    assert "do not match forward()'s signature" in error.value.hint


def test_an_input_of_the_wrong_size_names_the_sizes_and_says_to_fix_the_shapes():
    """fc1 is Linear(32, 64): a (2, 31) input cannot be multiplied by its (32, 64) weight."""
    with pytest.raises(ExportError) as error:
        analyze(TwoLayerMLP(), (torch.randn(2, 31),))
    assert "[2, 31] X [32, 64]" in error.value.torch_message
    assert "shapes (and dtypes) forward() expects" in error.value.hint


class Branchy(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1


def test_data_dependent_control_flow_carries_torchs_reason_and_the_hint():
    # On meta: with values, the example's decide the branch (tests/capture/test_value_branches.py).
    with pytest.raises(ExportError) as error:
        analyze(Branchy(), (torch.randn(3, device="meta"),))
    message = str(error.value)
    assert "Could not guard on data-dependent expression" in error.value.torch_message
    assert error.value.torch_message in message and error.value.hint in message
    assert "torch.cond" in error.value.hint


class _OffsetOnCpu(nn.Module):
    def forward(self, x):
        return x + torch.ones(x.shape[-1])  # made on cpu: no device=


def test_a_tensor_made_on_cpu_inside_a_meta_model_hints_at_cpu_not_at_the_signature():
    # torch's message names the "argument" it checked; the hint is about devices.
    with pytest.raises(ExportError) as error:
        analyze(_OffsetOnCpu(), (torch.zeros(2, 3, device="meta"),))
    assert "--device cpu" in error.value.hint
    assert "signature" not in error.value.hint


def test_a_directory_is_not_a_saved_program(tmp_path):
    with pytest.raises(FileNotFoundError, match="is a directory: pass the path of a file "
                                                "written by torch.export.save"):
        analyze(str(tmp_path))


def test_a_torch_save_checkpoint_is_not_a_program_and_the_error_says_what_to_do(tmp_path):
    path = tmp_path / "weights.pt2"
    torch.save(TwoLayerMLP().state_dict(), path)
    with pytest.raises(ValueError, match="not a program saved with torch.export.save") as error:
        analyze(str(path))
    assert "A checkpoint written by torch.save" in str(error.value)
    assert "torch.export.save(torch.export.export(model, args), path)" in str(error.value)


def fails_on_fc1(call):
    """The built-in linear formula, except on fc1's 32-wide input."""
    if call["weight"].shape[-1] == 32:
        raise ValueError("cannot count this layout")
    return linear(call)


def test_a_formula_that_raises_is_listed_by_node_and_the_rest_is_counted():
    """fc2, Linear(64, 10) on 2 rows: 2*64*10 = 1,280 MACs remain when fc1's formula fails."""
    report = analyze(TwoLayerMLP(), (X,), formulas={torch.ops.aten.linear: fails_on_fc1})
    [failed] = report.uncounted
    assert (failed.op, failed.nodes, failed.modules) == ("aten.linear.default", ["linear"],
                                                          ["fc1"])
    assert failed.reason == "ValueError: cannot count this layout"
    assert report.total.macs == 1_280


def test_a_formula_that_raises_under_strict_names_node_module_op_and_error():
    with pytest.raises(UncountedOpError) as error:
        analyze(TwoLayerMLP(), (X,), strict=True, formulas={torch.ops.aten.linear: fails_on_fc1})
    assert (error.value.node, error.value.module, error.value.op) == ("linear", "fc1",
                                                                      "aten.linear.default")
    assert "ValueError: cannot count this layout" in str(error.value)
    assert "register_formula(torch.ops.aten.linear.default, replace=True)" in str(error.value)
