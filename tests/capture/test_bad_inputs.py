"""Nothing the user gave is silently ignored; every bad input is a typed error saying what to do.
Expected counts are derived by hand in each test."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from torch import nn
from torch.export import Dim

from exportflops import ExportError, InputError, Report, analyze
from tests.models import TwoLayerMLP

np = pytest.importorskip("numpy")
X = torch.randn(2, 32)
# TwoLayerMLP: fc1 Linear(32, 64), fc2 Linear(64, 10): per row 32*64 + 64*10 = 2,688 MACs.
MACS_PER_ROW = 32 * 64 + 64 * 10


@pytest.fixture(scope="module")
def dynamic_program():
    return torch.export.export(TwoLayerMLP(), (X,), dynamic_shapes={"x": {0: Dim("batch")}})


def test_a_program_analyzed_with_inputs_is_counted_at_their_sizes(dynamic_program):
    report = analyze(dynamic_program, (torch.randn(5, 32),))
    assert report.total.macs == 5 * MACS_PER_ROW
    assert report.inputs[0].shape == [5, 32]


def test_a_saved_program_analyzed_with_inputs_is_counted_at_their_sizes(dynamic_program,
                                                                        tmp_path):
    path = tmp_path / "mlp.pt2"
    torch.export.save(dynamic_program, path)
    assert analyze(str(path), (torch.randn(7, 32),)).total.macs == 7 * MACS_PER_ROW


def test_inputs_a_static_program_was_not_exported_for_are_refused():
    program = torch.export.export(TwoLayerMLP(), (X,))
    with pytest.raises(InputError, match=r"has shape \[5, 32\], but the program was exported "
                                         r"for \[2, 32\]"):
        analyze(program, (torch.randn(5, 32),))


def test_dynamic_shapes_for_a_program_exported_already_are_refused(dynamic_program):
    with pytest.raises(InputError, match="exported already"):
        analyze(dynamic_program, dynamic_shapes={"x": {0: Dim("b")}})


def test_a_numpy_input_is_named_with_the_conversion_to_use():
    with pytest.raises(InputError, match=r"input args\[0\] of TwoLayerMLP is a numpy ndarray; "
                                         r"pass torch tensors: torch.from_numpy"):
        analyze(TwoLayerMLP(), (np.zeros((2, 32), dtype=np.float32),))


@pytest.mark.parametrize("dims", [{2: Dim("b")}, {-3: Dim("b")}], ids=["past-the-end", "negative"])
def test_a_dynamic_dim_that_does_not_exist_names_the_argument_and_its_dims(dims):
    with pytest.raises(InputError, match=r"dynamic_shapes\['x'\] names dim -?\d, but x of "
                                         r"TwoLayerMLP has 2 dims \(shape \[2, 32\]\): use dims "
                                         r"0..1"):
        analyze(TwoLayerMLP(), (X,), dynamic_shapes={"x": dims})


def test_a_dynamically_quantized_model_gets_its_own_hint():
    quantized = torch.ao.quantization.quantize_dynamic(TwoLayerMLP(), {nn.Linear},
                                                       dtype=torch.qint8)
    with pytest.raises(ExportError) as error:
        analyze(quantized, (X,))
    assert "eager-mode quantized modules" in error.value.hint
    assert "Cache" not in error.value.hint


def _rewrite(source, target, member_suffix: str, data: bytes) -> None:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            new.writestr(item, data if item.filename.endswith(member_suffix)
                         else old.read(item.filename))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "mlp.pt2"
    torch.export.save(torch.export.export(TwoLayerMLP(), (X,)), path)
    return path


def test_a_pt2_of_another_archive_version_says_it_was_saved_by_another_torch(saved, tmp_path):
    other = tmp_path / "other.pt2"
    _rewrite(saved, other, "archive_version", b"7")
    with pytest.raises(ValueError, match="was saved by another torch: archive version 7") as error:
        analyze(str(other))
    assert f"This is torch {torch.__version__}" in str(error.value)


def test_a_pt2_of_another_schema_major_says_it_was_saved_by_another_torch(saved, tmp_path):
    with zipfile.ZipFile(saved) as archive:
        name = next(n for n in archive.namelist() if n.endswith("models/model.json"))
        model = json.loads(archive.read(name))
    model["schema_version"]["major"] += 1
    other = tmp_path / "other.pt2"
    _rewrite(saved, other, "models/model.json", json.dumps(model).encode())
    with pytest.raises(ValueError, match="saved by another torch: export schema"):
        analyze(str(other))


def test_a_failed_pt2_load_carries_the_deserializers_cause_not_check_the_warnings(saved,
                                                                                  tmp_path):
    other = tmp_path / "other.pt2"
    _rewrite(saved, other, ".data/version", b"99\n")
    with pytest.raises(ValueError) as error:
        analyze(str(other))
    assert "version 99" in str(error.value)
    assert "check the warnings above" not in str(error.value)


class ReseedsThenFails(nn.Module):
    """Python in forward runs for real during export: a reseed moves the global stream."""

    def forward(self, x):
        torch.manual_seed(1234)
        return x @ torch.ones(x.shape[0] + 1)  # sizes that cannot multiply


class ReseedsThenBranches(nn.Module):
    def forward(self, x):
        torch.manual_seed(1234)
        return x * 2 if x.sum() > 0 else x  # exported twice: the values decide the branch


@pytest.mark.parametrize("model", [ReseedsThenFails(), ReseedsThenBranches()],
                         ids=["failed", "decided-by-values"])
def test_an_analysis_leaves_the_global_random_stream_as_it_was(model):
    x = torch.randn(4)
    torch.manual_seed(0)
    expected_next = torch.rand(3)
    torch.manual_seed(0)
    if isinstance(model, ReseedsThenFails):
        with pytest.raises(ExportError):
            analyze(model, (x,))
    else:
        assert analyze(model, (x,)).value_guards
    assert torch.equal(torch.rand(3), expected_next)


class NonzeroSum(nn.Module):
    def forward(self, x):
        return x[x > 0].sum()


def test_a_data_dependent_size_is_listed_evaluable_and_round_trips():
    """x of 8 on meta (no values): the comparison is 8 FLOPs (one per element) and the sum adds
    the u0 selected elements (u0 FLOPs): u0 + 8, so 11 at u0 = 3."""
    report = analyze(NonzeroSum(), (torch.randn(8, device="meta"),))
    [size] = report.symbols
    assert (size.name, size.example, size.data_dependent) == ("u0", None, True)
    assert report.evaluate(u0=3).total.flops == 3 + 8
    assert Report.model_validate_json(report.model_dump_json()) == report
    with pytest.raises(ValueError, match="data-dependent and has no example value: pass u0="):
        report.evaluate()


def test_a_data_dependent_size_of_real_inputs_is_the_examples():
    # By hand: 4 of the 8 values are positive, so 8 comparisons and 4 additions.
    x = torch.tensor([1.0, -1.0, 2.0, -2.0, 3.0, 0.0, -3.0, 4.0])
    report = analyze(NonzeroSum(), (x,))
    assert report.total.flops == 8 + 4 and report.symbols == []


@pytest.mark.parametrize("weights, inputs", [("meta", "cpu"), ("cpu", "meta")])
def test_inputs_on_another_device_than_the_weights_say_which(weights, inputs):
    """A model built on meta given cpu inputs (or the reverse) fails in torch.export; the hint
    names both devices and where to create the inputs, not the model's own code."""
    with pytest.raises(ExportError, match=f"inputs are on {inputs} and the model's weights on "
                                          f"{weights}: create the inputs on {weights}"):
        analyze(nn.Linear(8, 4, device=weights), (torch.randn(2, 8, device=inputs),))
