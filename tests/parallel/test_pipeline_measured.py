"""Measured pipeline timelines: each stage run for real on what it receives, its forward and
backward timed, and the schedule laid out from those times (``analyze_pipeline(measure=True)``,
``--pp N --profile``). Times are the machine's: the tests check where they go and that nothing
of the user's is changed, not their values."""

from __future__ import annotations

import pytest
import torch

from exportflops.cli import main
from exportflops.errors import InputError, ProfileError
from exportflops.parallel.pipeline import analyze_pipeline


class Normed(torch.nn.Module):
    """Linear, batch norm (whose running statistics a training forward writes), dropout (a
    random draw) and linear again: split before ``bn`` and before ``out``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(self.bn(self.inp(x))))


@pytest.fixture(scope="module")
def measured():
    torch.manual_seed(0)
    model = Normed().train()
    x = torch.randn(6, 8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    analysis = analyze_pipeline(model, (x,), stages=["bn", "out"], schedule="gpipe",
                                microbatches=3, measure=True, warmup=1, repeat=3)
    return model, state, rng, analysis.record


def test_each_action_lasts_its_stages_measured_time(measured):
    *_, record = measured
    assert record.times == "measured" and record.device.startswith("cpu")
    assert "median of 3 after 1 warmup" in record.timer
    assert all(s.forward_s > 0 and s.backward_s > 0 for s in record.stages)
    for action in record.timeline:
        stage = record.stages[action.stage]
        took = stage.forward_s if action.kind == "forward" else stage.backward_s
        assert action.end_s - action.start_s == pytest.approx(took)


def test_measuring_leaves_the_model_and_the_generator_as_they_were(measured):
    model, state, rng, _ = measured
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # bn's stats
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


def test_a_zero_bubble_schedule_times_torchs_two_passes_and_leaves_grad_as_it_was():
    torch.manual_seed(0)
    model = Normed().train()
    kept = torch.ones(4, 16)
    model.out.weight.grad = kept  # a gradient the user accumulated: not to be written
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(6, 8, requires_grad=True)  # its gradient, too, is not to be written
    # Split before bn: two stages, both on one rank (ZB-V's V with p = 1).
    record = analyze_pipeline(model, (x,), stages=["bn"],
                              schedule="zbvzerobubble", microbatches=2, stages_per_rank=2,
                              measure=True, warmup=1, repeat=3).record
    assert "stage_backward_input then stage_backward_weight" in record.timer
    first, *rest = record.stages
    # torch runs the first stage's whole backward in W, whatever its input needs.
    assert first.backward_input_s == 0 and first.backward_weight_s > 0
    assert all(s.backward_input_s > 0 and s.backward_weight_s > 0 for s in rest)
    for action in record.timeline:
        stage = record.stages[action.stage]
        took = {"forward": stage.forward_s, "backward_input": stage.backward_input_s,
                "backward_weight": stage.backward_weight_s}[action.kind]
        assert action.end_s - action.start_s == pytest.approx(took)
    assert model.out.weight.grad is kept and torch.equal(kept, torch.ones(4, 16))
    assert x.grad is None
    assert all(p.grad is None for name, p in model.named_parameters() if name != "out.weight")
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_dualpipev_times_the_whole_backward_it_runs_and_leaves_grad_as_it_was():
    torch.manual_seed(0)
    model = Normed().train()
    x = torch.randn(6, 8, requires_grad=True)
    # Two stages on one rank (DualPipeV's V with p = 1), 2 microbatches (at least 2p).
    record = analyze_pipeline(model, (x,), stages=["bn"], schedule="dualpipev",
                              microbatches=2, stages_per_rank=2, measure=True, warmup=1,
                              repeat=3).record
    whole = [a for a in record.timeline if a.kind == "backward"]
    assert whole  # torch's order runs whole backwards too
    for action in whole:  # each timed as its stage's whole backward, measured on its own
        assert action.end_s - action.start_s == pytest.approx(
            record.stages[action.stage].backward_s)
    assert all(s.backward_s > 0 for s in record.stages)
    assert x.grad is None and all(p.grad is None for p in model.parameters())


def test_a_meta_model_has_nothing_to_run():
    with torch.device("meta"):
        model = Normed()
    with pytest.raises(ProfileError, match="meta device.*build it on a real device"):
        analyze_pipeline(model, (torch.randn(6, 8, device="meta"),), stages=["bn"],
                         measure=True)


def test_measured_times_take_no_roofline_device():
    with pytest.raises(InputError, match="no roofline device"):
        analyze_pipeline(Normed(), (torch.randn(6, 8),), stages=["bn"], measure=True,
                         device="a100-sxm")


STACK = """
import torch


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""


def test_the_command_measures_the_stages_with_profile(tmp_path, capsys):
    (tmp_path / "stack.py").write_text(STACK)
    code = main([f"{tmp_path / 'stack.py'}:Stack", "--input", "6,8", "--device", "cpu",
                 "--mode", "train", "--pp", "2", "--profile", "--warmup", "0", "--repeat", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "times: measured on cpu" in out and "median of 2 after 0 warmup" in out


def test_the_command_measures_no_stage_counted_on_fake_ranks(capsys):
    assert main(["llama", "--pp", "2", "--tp", "2", "--profile", "--device", "cpu"]) == 2
    assert "--profile" in capsys.readouterr().err
