"""exportflops.memory against torch's profiler on real cpu steps, and by hand."""

from __future__ import annotations

import functools
import re

import pytest
import torch

import exportflops
from exportflops import InputError, MemoryReport
from exportflops.errors import ProfileError
from tests.footprint.models import CASES, FP32
from tests.footprint.profiled import Measured, forward_step, profiled, training_step

#: Issue 50's bar: the predicted peak within 3% of the profiler's.
TOLERANCE = 0.03


@functools.cache
def _train(name: str) -> tuple[MemoryReport, Measured]:
    """The prediction and the profiler's measure of a training step of case ``name`` (each
    on a fresh model: the measured run trains it), shared by the tests below."""
    case = CASES[name]
    model, args, kwargs = case.build()
    predicted = exportflops.memory(model, args, kwargs, loss=case.loss)
    model, args, kwargs = case.build()
    return predicted, profiled(training_step(model, lambda: case.loss(model(*args, **kwargs))))


@pytest.mark.parametrize("name", CASES)
def test_a_training_steps_peak_is_the_profilers_within_3_percent(name):
    predicted, measured = _train(name)
    assert predicted.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)


# Reentrant checkpointing warns under no_grad that no input needs a gradient, in both runs.
@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_forwards_peak_is_the_profilers_within_3_percent(case):
    model, args, kwargs = case.build()
    kwargs = {k: v for k, v in kwargs.items() if k != "labels"}  # inference computes no loss
    predicted = exportflops.memory(model, args, kwargs, mode="forward")
    measured = profiled(forward_step(model, *args, **kwargs))
    assert predicted.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)


@pytest.mark.parametrize("name", CASES)
def test_parameters_gradients_and_adamw_states_are_exact_to_the_byte(name):
    case = CASES[name]
    report, measured = _train(name)
    params = case.params * FP32
    # exp_avg and exp_avg_sq per parameter, and a 0-dim float32 `step` per parameter tensor
    # (torch/optim/adamw.py: a cpu tensor unless capturable or fused).
    states = 2 * params + case.tensors * FP32
    found = report.max_by_kind
    assert (found.parameters, found.gradients, found.optimizer) == (params, params, states)
    # The hand derivation checked against the profiler's own categories.
    by_category = measured.max_by_category
    assert (by_category["PARAMETER"], by_category["OPTIMIZER_STATE"]) == (params, states)
    if not case.inner_leaves:
        assert by_category["GRADIENT"] == params


def _linear():
    return torch.nn.Linear(3, 5), (torch.randn(2, 3),)


def test_a_linear_forward_by_hand_exact_and_in_cuda_blocks():
    model, args = _linear()
    exact = exportflops.memory(model, args, mode="forward")
    blocks = exportflops.memory(model, args, mode="forward", allocator="cuda")
    # weight 5x3, bias 5, input 2x3, output 2x5, float32; each under 512 B is one CUDA block
    assert exact.peak_bytes == (15 + 5 + 6 + 10) * FP32
    assert blocks.peak_bytes == 4 * 512


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(2, 8),)


def test_a_forward_holds_a_layers_input_until_the_next_layer_has_made_its_output():
    model, args = _mlp()
    report = exportflops.memory(model, args, mode="forward")
    params = (8 * 16 + 16 + 16 * 4 + 4) * FP32
    # At the ReLU: the input (2x8), the first Linear's output (2x16) it reads, its own (2x16);
    # the first output is freed once Sequential rebinds its variable, before the last Linear.
    assert report.peak_bytes == params + (2 * 8 + 2 * 16 + 2 * 16) * FP32
    assert (report.peak_node, report.peak_module) == ("aten.relu.default #2", "1")


def test_an_activation_belongs_to_the_module_that_saves_it_first():
    model, args = _mlp()
    modules = {m.path: m for m in exportflops.memory(model, args).modules}
    # ReLU saves its output for threshold_backward; the last Linear saves that same tensor
    # (its input) and adds nothing; the first Linear's input is the model's input.
    relu_output = 2 * 16 * FP32
    assert [modules[path].own_activations for path in ("", "0", "1", "2")] == \
        [0, 0, relu_output, 0]


def test_a_frozen_layer_has_no_gradient_and_no_optimizer_state():
    model, args = _mlp()
    model[0].requires_grad_(False)
    report = exportflops.memory(model, args)
    trained = (16 * 4 + 4) * FP32  # the last Linear's weight and bias
    # AdamW makes state for a parameter with a gradient only: two moments and two `step`s
    assert (report.max_by_kind.gradients, report.max_by_kind.optimizer) == \
        (trained, 2 * trained + 2 * FP32)


class HoldsATable(torch.nn.Module):
    """A tensor held as a plain attribute, not registered as a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.ones(100)
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x):
        return x * self.scale


def test_buffers_and_tensors_held_as_attributes_are_buffers_used_or_not():
    report = exportflops.memory(HoldsATable(), (torch.randn(2, 3),), mode="forward")
    assert report.max_by_kind.buffers == (100 + 3) * FP32


class AddsTwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_a_tensor_given_as_two_inputs_is_one_input_storage():
    x = torch.randn(2, 3)  # as a language model gets input_ids again as labels
    report = exportflops.memory(AddsTwoInputs(), (x, x), mode="forward")
    assert report.max_by_kind.inputs == 2 * 3 * FP32


def test_sgd_with_momentum_keeps_one_buffer_per_parameter_and_without_none():
    model, args = _linear()
    momentum = exportflops.memory(model, args, optimizer="sgd",
                                  optimizer_options={"momentum": 0.9})
    plain = exportflops.memory(model, args, optimizer="sgd")
    assert momentum.max_by_kind.optimizer == (15 + 5) * FP32  # a buffer the shape of each
    assert plain.max_by_kind.optimizer == 0


def test_the_kinds_at_the_peak_sum_to_it_and_the_timeline_reaches_it():
    report, _ = _train("gpt2-shaped")
    assert report.by_kind.total == report.peak_bytes
    assert max(point.live.total for point in report.timeline) == report.peak_bytes
    assert {point.phase for point in report.timeline} == {"forward", "backward", "optimizer"}
    for kind in type(report.by_kind).model_fields:
        assert getattr(report.by_kind, kind) <= getattr(report.max_by_kind, kind)


def test_a_modules_activations_are_its_own_plus_its_childrens():
    modules = _train("gpt2-shaped")[0].modules
    for module in modules:
        children = [m for m in modules if m.depth == module.depth + 1
                    and m.path.startswith(f"{module.path}." if module.path else "")]
        assert module.activations == module.own_activations + sum(m.activations
                                                                  for m in children)
    root = modules[0]
    assert root.activations > 0 and root.path == ""


def test_a_model_on_meta_has_the_peak_of_the_same_model_on_cpu():
    model, args, _ = CASES["gpt2-shaped"].build()
    with torch.device("meta"):
        on_meta = type(model)(model.config)
    meta_args = tuple(a.to("meta") for a in args)
    assert exportflops.memory(on_meta, meta_args) == _train("gpt2-shaped")[0]


def test_the_report_round_trips_through_json():
    model, args = _linear()
    report = exportflops.memory(model, args)
    assert MemoryReport.model_validate_json(report.model_dump_json()) == report


def test_the_users_model_is_untouched():
    model, args = _linear()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    exportflops.memory(model, args)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks


@pytest.mark.parametrize("options, words", [
    ({"optimizer": "lion"}, "optimizer='lion' for Linear: memory() knows adagrad, adam, adamw, "
                            "rmsprop, sgd, or takes a torch.optim.Optimizer"),
    ({"mode": "eval"}, "mode='eval' for Linear"),
    ({"allocator": "xla"}, "allocator='xla' for Linear"),
    ({"optimizer_options": {"betas": 0.9}}, "optimizer_options={'betas': 0.9} for Linear: "
                                            "torch.optim.AdamW refuses them"),
], ids=["optimizer", "mode", "allocator", "optimizer-options"])
def test_an_unknown_option_is_an_input_error_naming_the_choices(options, words):
    model, args = _linear()
    with pytest.raises(InputError, match=re.escape(words)):
        exportflops.memory(model, args, **options)


def test_a_model_with_no_output_needing_a_gradient_asks_for_a_loss():
    model = torch.nn.Embedding(4, 2).requires_grad_(False)
    with pytest.raises(InputError, match="pass loss=, or mode='forward'"):
        exportflops.memory(model, (torch.tensor([1, 2]),))


class ReadsAValue(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else x


def test_a_forward_that_reads_a_value_is_a_profile_error_saying_why():
    with pytest.raises(ProfileError, match=r"one training step of ReadsAValue on fake tensors "
                                           r"failed: DataDependentOutputException.*\.item\(\)"):
        exportflops.memory(ReadsAValue(), (torch.randn(2, 4),))
