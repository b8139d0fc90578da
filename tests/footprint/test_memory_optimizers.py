"""exportflops.memory with the user's optimizer instance and with bf16 precisions, against
torch's profiler on real cpu steps and by hand."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

import exportflops
from exportflops import InputError
from tests.footprint.profiled import profiled

#: Issue 50's bar: the predicted peak within 3% of the profiler's.
TOLERANCE = 0.03
FP32, BF16 = 4, 2
#: The MLP below: 64 x 128 + 128 and 128 x 32 + 32 parameters, in 4 tensors.
N, TENSORS = 64 * 128 + 128 + 128 * 32 + 32, 4


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 32))
    return model, torch.randn(16, 64)


def _summed(output: torch.Tensor) -> torch.Tensor:
    return output.float().sum()


def _step(model: torch.nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer,
          forward_context=contextlib.nullcontext):
    """The loop's step: forward and loss under ``forward_context()``, backward, step,
    ``zero_grad(set_to_none=True)``."""
    def step() -> None:
        with forward_context():
            value = _summed(model(x))
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _kinds(report: exportflops.MemoryReport, measured) -> tuple[tuple, tuple]:
    """(parameters, gradients, optimizer) at their maxima: predicted, and the profiler's."""
    found, by_category = report.max_by_kind, measured.max_by_category
    return ((found.parameters, found.gradients, found.optimizer),
            (by_category["PARAMETER"], by_category["GRADIENT"],
             by_category["OPTIMIZER_STATE"]))


# States per parameter by torch/optim/<name>.py's _init_group, plus a 0-dim float32 `step`
# per parameter tensor where the class keeps one (SGD keeps none).
OPTIMIZERS = [
    pytest.param(torch.optim.Adagrad, {}, N * FP32 + TENSORS * FP32, id="adagrad-state_sum"),
    pytest.param(torch.optim.RMSprop, {"momentum": 0.9, "centered": True},
                 3 * N * FP32 + TENSORS * FP32, id="rmsprop-square_avg-momentum-grad_avg"),
    pytest.param(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, N * FP32,
                 id="sgd-momentum_buffer"),
    pytest.param(torch.optim.Adam, {"amsgrad": True, "foreach": False},
                 3 * N * FP32 + TENSORS * FP32, id="adam-amsgrad-max_exp_avg_sq"),
]


@pytest.mark.parametrize(("kind", "options", "states"), OPTIMIZERS)
def test_an_optimizer_instances_states_are_what_its_class_allocates(kind, options, states):
    model, x = _mlp()
    optimizer = kind(model.parameters(), **options)
    report = exportflops.memory(model, (x,), optimizer=optimizer, loss=_summed)
    measured = profiled(_step(model, x, optimizer))
    assert _kinds(report, measured) == ((N * FP32, N * FP32, states),) * 2
    assert report.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)
    assert report.optimizer == kind.__qualname__


def test_an_optimizer_instance_is_read_not_stepped():
    model, x = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # states on step 1
    before = [p.detach().clone() for p in model.parameters()]
    exportflops.memory(model, (x,), optimizer=optimizer, loss=_summed)
    assert optimizer.state == {}
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_an_optimizer_over_a_subset_keeps_states_for_that_subset_only():
    model, x = _mlp()
    first = model[0]
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1, momentum=0.9)
    report = exportflops.memory(model, (x,), optimizer=optimizer, loss=_summed)
    assert report.max_by_kind.optimizer == (64 * 128 + 128) * FP32  # one buffer, first layer


def test_an_optimizer_over_another_models_parameters_is_refused():
    model, x = _mlp()
    other, _ = _mlp()
    with pytest.raises(InputError, match=r"param_groups\[0\] holds 4 tensor\(s\) that are not "
                                         r"parameters of the Sequential given"):
        exportflops.memory(model, (x,), optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


class _Scaled(torch.optim.SGD):
    """An optimizer whose constructor takes what its defaults do not hold."""

    def __init__(self, params, scale: float) -> None:
        super().__init__(params, lr=0.1 * scale)


def test_an_optimizer_class_that_cannot_be_rebuilt_is_refused():
    model, x = _mlp()
    with pytest.raises(InputError, match="_Scaled given for Sequential cannot be rebuilt"):
        exportflops.memory(model, (x,), optimizer=_Scaled(model.parameters(), 2.0),
                           loss=_summed)


def _master_weights_step(model: torch.nn.Module, x: torch.Tensor):
    """The hand-written bf16 loop: bf16 model, fp32 master copy, AdamW on the masters; each
    bf16 gradient becomes its master's fp32 gradient and is dropped."""
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    parameters = list(model.parameters())
    masters = [p.detach().float() for p in parameters]
    optimizer = torch.optim.AdamW(masters)

    def step() -> None:
        _summed(model(x)).backward()
        with torch.no_grad():
            for parameter, master in zip(parameters, masters):
                master.grad = parameter.grad.float()
                parameter.grad = None
            optimizer.step()
            for parameter, master in zip(parameters, masters):
                parameter.copy_(master)
        optimizer.zero_grad(set_to_none=True)
    return step


def test_bf16_master_weights_match_a_hand_written_loop_and_14_bytes_per_parameter():
    model, x = _mlp()
    report = exportflops.memory(model, (x,), precision="bf16-master", loss=_summed)
    measured = profiled(_master_weights_step(*_mlp()))
    assert report.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)
    found = report.max_by_kind
    # bf16 parameter 2; fp32 master 4, exp_avg 4, exp_avg_sq 4 (counted as optimizer): the
    # 2 + 4 + 4 + 4 of Megatron's distributed optimizer table, and AdamW's 0-dim steps.
    assert found.parameters == N * BF16
    assert found.optimizer == N * (FP32 + 2 * FP32) + TENSORS * FP32
    by_category = measured.max_by_category  # the profiler calls the masters parameters
    assert (by_category["PARAMETER"] + by_category["OPTIMIZER_STATE"]
            == found.parameters + found.optimizer)
    # The fp32 gradients of the masters, made while the bf16 ones are dropped one by one.
    assert found.gradients == by_category["GRADIENT"]
    assert N * FP32 <= found.gradients < N * (FP32 + BF16)


def _bf16_true() -> tuple[exportflops.MemoryReport, object]:
    model, x = _mlp()
    report = exportflops.memory(model, (x,), precision="bf16-true", loss=_summed)
    model, x = _mlp()
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    return report, profiled(_step(model, x, torch.optim.AdamW(model.parameters())))


def test_bf16_true_keeps_every_state_in_bf16():
    report, measured = _bf16_true()
    # AdamW's exp_avg and exp_avg_sq take the parameter's dtype; `step` stays float32.
    assert _kinds(report, measured) == ((N * BF16, N * BF16, 2 * N * BF16 + TENSORS * FP32),) * 2


# A known gap, as the CNN's in test_memory.py: on cpu, inside the first Linear's bf16
# AddmmBackward0, 50,944 bytes are allocated with no tensor on them (the profiler's timeline
# holds them under a key with no storage: a kernel's scratch), below the dispatch level the
# step is recorded at; with every state in bf16 they land at the peak (16% over).
@pytest.mark.xfail(strict=True, reason="cpu oneDNN bf16 matmul scratch")
def test_bf16_true_peak_is_the_profilers_within_3_percent():
    report, measured = _bf16_true()
    assert report.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)


def test_an_unknown_precision_is_refused_with_the_known_ones():
    model, x = _mlp()
    with pytest.raises(InputError, match="precision='fp16' for Sequential: memory\\(\\) knows "
                                         "32-true, bf16-mixed, bf16-true, bf16-master"):
        exportflops.memory(model, (x,), precision="fp16")


def test_bf16_mixed_is_autocast_over_fp32_parameters_as_a_real_autocast_loop():
    model, x = _mlp()
    report = exportflops.memory(model, (x,), precision="bf16-mixed", loss=_summed)
    model, x = _mlp()
    # Lightning's bf16-mixed: the forward and loss under autocast.
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    measured = profiled(_step(model, x, torch.optim.AdamW(model.parameters()), autocast))
    # fp32 parameters and gradients; AdamW's two fp32 moments and the 0-dim steps.
    assert _kinds(report, measured) == ((N * FP32, N * FP32, 2 * N * FP32 + TENSORS * FP32),) * 2
    assert report.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOLERANCE)


def test_a_per_rank_analysis_refuses_an_optimizer_instance_naming_the_names():
    from exportflops.parallel import Layout, memory_ranks
    from tests.footprint.rank_models import MODELS

    model, args = MODELS["tp"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(InputError, match="optimizer=SGD instance for WideNet: this analysis "
                                         "takes the optimizer by name"):
        memory_ranks(model, args, layout=Layout(tp=2), rank=0, optimizer=optimizer)
