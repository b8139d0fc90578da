"""An MoE's grouped matmul in float32: its meta kernel takes bfloat16 only, its cpu kernel
float32 too; the step runs as on cpu. (The Mixtral against the profiler: test_memory.py.)"""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops.errors import ProfileError
from tests.footprint.models import CASES, FP32

INT32 = 4


class GroupedLinear(torch.nn.Module):
    """``experts`` weights of ``width x out``; rows of x go to the expert ``offs`` says."""

    def __init__(self, experts: int, width: int, out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, width, out))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight, offs=offs)


def test_a_float32_grouped_matmuls_output_is_counted_as_the_cpu_kernel_makes_it():
    model = GroupedLinear(experts=3, width=8, out=16)
    x, offs = torch.randn(6, 8), torch.tensor([2, 4, 6], dtype=torch.int32)
    report = exportflops.memory(model, (x, offs), mode="forward")
    # weight 3x8x16, x 6x8, offs 3 int32, output 6x16 (one row per row of x)
    assert report.peak_bytes == (3 * 8 * 16 + 6 * 8 + 6 * 16) * FP32 + 3 * INT32
    assert report.peak_node == "aten._grouped_mm.default #0"


class TransposedGroupedLinear(GroupedLinear):
    """The weight held as ``experts x out x width``, multiplied transposed (as transformers'
    experts hold theirs), so that its leading stride is ``width``, not ``out``."""

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight.transpose(-2, -1), offs=offs)


def test_an_output_row_is_padded_to_16_bytes_as_the_cpu_kernel_pads_it():
    # Eager on cpu, a (6, 5) float32 output of _grouped_mm has strides (8, 1): its storage is
    # (6 - 1) x 8 + 5 = 45 elements, 180 bytes, not 6 x 5 = 30.
    model = TransposedGroupedLinear(3, 5, 8)  # weight (3, 5, 8), multiplied as (3, 8, 5)
    x, offs = torch.randn(6, 8), torch.tensor([2, 4, 6], dtype=torch.int32)
    report = exportflops.memory(model, (x, offs), mode="forward")
    output = ((6 - 1) * 8 + 5) * FP32
    assert report.peak_bytes == (3 * 5 * 8 + 6 * 8) * FP32 + 3 * INT32 + output


def test_a_float64_grouped_matmul_is_refused_as_the_meta_kernel_refuses_it():
    # the cpu kernel refuses float64 too ("Expected mat_a to be Float32, BFloat16 or Float16")
    model = GroupedLinear(experts=3, width=8, out=16).double()
    x, offs = torch.randn(6, 8, dtype=torch.float64), torch.tensor([2, 4, 6], dtype=torch.int32)
    with pytest.raises(ProfileError, match="Expected inputs of BF16 type"):
        exportflops.memory(model, (x, offs), mode="forward")


def test_rows_no_multiple_of_16_bytes_are_refused_as_the_cpu_kernel_refuses_them():
    # eager on cpu: torch._grouped_mm of a (6, 6) float32 x raises "strides should be multiple
    # of 16 bytes" (6 x 4 = 24 bytes a row)
    model = GroupedLinear(experts=3, width=6, out=16)
    x, offs = torch.randn(6, 6), torch.tensor([2, 4, 6], dtype=torch.int32)
    with pytest.raises(ProfileError, match=r"refuses mat_a of strides \(6, 1\) "
                                           r"\(torch.float32\): strides should be multiple"):
        exportflops.memory(model, (x, offs), mode="forward")


def test_an_eager_experts_loop_reads_the_routing_and_is_a_profile_error_saying_so():
    model, args, kwargs = CASES["mixtral-2-layers"].build()
    model.set_experts_implementation("eager")
    with pytest.raises(ProfileError, match=r"nonzero.*eager experts loop; transformers' "
                                           r"default grouped_mm experts read none"):
        exportflops.memory(model, args, kwargs)
