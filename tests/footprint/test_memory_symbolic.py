"""exportflops.memory(..., dynamic_shapes=...): polynomials in the sizes, compared with concrete
steps at those sizes, and refused where the step changes with its sizes."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn
from torch.export import Dim

import exportflops
from exportflops.errors import InputError
from exportflops.records import SymbolicMemoryReport
from tests.footprint.models import FP32, GPT_PARAMS, gpt, hf_loss, llama, summed

INT64 = 8  # bytes per token id

# Each model's example inputs resized along one dim (as a user would build them), and the
# dynamic_shapes naming that dim.
BATCH, SEQ = Dim("batch"), Dim("seq", max=64)  # GPT_SMALL's block_size bounds its positions


def _gpt_at(batch: int, seq: int) -> tuple[tuple, dict]:
    return (torch.randint(0, 256, (batch, seq)),), {}


def _llama_at(batch: int, seq: int) -> tuple[tuple, dict]:
    ids = torch.randint(0, 256, (batch, seq))
    return (), {"input_ids": ids, "labels": ids}


CASES = {  # name: (build, loss, inputs at (batch, seq), example (batch, seq), specs by size)
    "gpt2-shaped": (gpt, summed, _gpt_at, (2, 64),
                    {"batch": ({0: BATCH},), "seq": ({1: SEQ},)}),
    "llama-4-layers": (llama, hf_loss, _llama_at, (2, 32),
                       {"batch": {"input_ids": {0: BATCH}, "labels": {0: BATCH}},
                        "seq": {"input_ids": {1: SEQ}, "labels": {1: SEQ}}}),
}


@functools.cache
def _symbolic(name: str, size: str) -> SymbolicMemoryReport:
    build, loss, _, _, specs = CASES[name]
    model, args, kwargs = build()
    return exportflops.memory(model, args, kwargs, loss=loss, dynamic_shapes=specs[size])


@pytest.mark.parametrize("size", ["batch", "seq"])
@pytest.mark.parametrize("name", CASES)
def test_the_peak_at_three_sizes_is_the_concrete_steps_peak(name, size):
    build, loss, inputs_at, example, _ = CASES[name]
    report = _symbolic(name, size)
    model, _, _ = build()
    for value in (3, 11, 64):  # none of them sampled (2, 3, 4 and the check) but 3
        batch, seq = (value, example[1]) if size == "batch" else (example[0], value)
        concrete = exportflops.memory(model, *inputs_at(batch, seq), loss=loss)
        at = report.evaluate(**{size: value})
        assert (at.peak_bytes, at.peak_node, at.peak_phase, at.peak_module) == (
            concrete.peak_bytes, concrete.peak_node, concrete.peak_phase, concrete.peak_module)
        assert (at.by_kind, at.max_by_kind) == (concrete.by_kind, concrete.max_by_kind)


def test_the_kinds_are_polynomials_in_the_size():
    report = _symbolic("gpt2-shaped", "seq")
    first = report.candidates[0].live
    # Two rows of seq int64 token ids; the parameters (wte tied with lm_head) in fp32.
    assert first.inputs == f"{2 * INT64}*seq"
    assert first.parameters == str(GPT_PARAMS * FP32)
    assert report.sizes[0].max == 64 and report.verified_at == {"seq": 64}


def test_the_report_round_trips_through_json():
    report = _symbolic("gpt2-shaped", "batch")
    assert SymbolicMemoryReport.model_validate_json(report.model_dump_json()) == report


class _Branches(nn.Module):
    """Doubles its input's rows from 4 rows on: a step that changes with the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= 4:
            x = torch.cat([x, x])
        return self.linear(x)


class _Pads(nn.Module):
    """Pads its rows to a multiple of 8: bytes that are no polynomial in the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 8)))


def test_a_step_that_changes_with_its_sizes_is_refused():
    with pytest.raises(InputError, match=r"The step of _Branches changes with its sizes: at "
                                         r"\{'batch': 2\} op #0 is aten\.t\.default in 'linear' "
                                         r"\(forward\), at \{'batch': 4\} aten\.cat\.default"):
        exportflops.memory(_Branches(), (torch.ones(2, 8),), mode="forward",
                           dynamic_shapes=({0: BATCH},))


def test_bytes_that_are_no_polynomial_are_refused_at_the_check():
    # Sampled at 2, 3, 4 rows (all padded to 8), checked at the example's 10 (padded to 16).
    with pytest.raises(InputError, match=r"at \{'batch': 10\} are \d+ bytes at op #\d+ .* no "
                                         r"product of sizes of degree <= 2"):
        exportflops.memory(_Pads(), (torch.ones(10, 8),), mode="forward",
                           dynamic_shapes=({0: BATCH},))


def test_sizes_outside_the_sampled_range_and_the_cuda_allocator_are_refused():
    report = _symbolic("gpt2-shaped", "seq")
    with pytest.raises(InputError, match=r"seq=65: GPT's memory holds for integers in \[2, 64\]"):
        report.evaluate(seq=65)
    with pytest.raises(InputError, match=r"seq=1: .*\(the sizes sampled start at 2\)"):
        report.evaluate(seq=1)
    with pytest.raises(InputError, match="CUDA allocator's rounding is no polynomial"):
        exportflops.memory(_Pads(), (torch.ones(10, 8),), allocator="cuda",
                           dynamic_shapes=({0: BATCH},))


def test_the_largest_size_is_the_last_whose_evaluated_peak_fits():
    report = _symbolic("llama-4-layers", "batch")
    budget = report.evaluate(batch=9).peak_bytes
    assert report.largest("batch", budget) == 9  # the peak grows with every row
    assert report.largest("batch", budget - 1) == 8
    assert report.largest("batch", 1000) == 0


def test_the_largest_of_each_size_is_the_last_whose_evaluated_peak_fits():
    report = _symbolic("llama-4-layers", "seq")
    assert report.example_sizes() == {"seq": 32}  # CASES' example (2, 32)
    budget = report.evaluate(seq=40).peak_bytes
    assert report.largest_each(budget) == {"seq": 40}
    assert report.largest_each(budget - 1) == {"seq": 39}


def test_the_command_prints_the_polynomials_and_the_largest_batch_a_device_holds(tmp_path,
                                                                                  capsys):
    from exportflops.cli import main
    from tests.planner.test_cli_fit import MODEL

    (tmp_path / "fit_models.py").write_text(MODEL)
    target = f"{tmp_path / 'fit_models.py'}:blocks"
    assert main([target, "--memory", "--dynamic", "batch", "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)["candidates"][0]["live"]
    # Blocks: an embedding 16x8, two blocks of Linear(8, 32) and Linear(32, 8), in fp32.
    assert first["parameters"] == str((16 * 8 + 2 * (8 * 32 + 32 + 32 * 8 + 8)) * FP32)
    assert first["inputs"] == f"{4 * INT64}*batch"  # ids of 4 tokens a row
    assert main([target, "--memory", "--dynamic", "batch", "--device-model", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "largest batch that fits h100-sxm (80000000000 bytes): " in out
