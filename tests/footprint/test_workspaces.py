"""The bytes a cpu convolution holds inside its kernel (exportflops.footprint.workspaces): by
hand from aten/src/ATen/native/mkldnn/Conv.cpp, and against torch's profiler on this cpu."""

from __future__ import annotations

import pytest
import torch
from torch._C._profiler import _EventType
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

from exportflops.footprint.workspaces import workspace, workspace_bytes, WORKSPACES

aten = torch.ops.aten
FP32 = 4
CAPABILITY = torch.backends.cpu.get_cpu_capability()
AVX512 = pytest.mark.skipif(not CAPABILITY.startswith("AVX512"),
                            reason="the bytes by hand are an AVX-512 cpu's (16 channels a block)")
#: The rule was measured on AVX-512 and, with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2,
#: on AVX2 (8 channels a block).
MEASURED_ISA = pytest.mark.skipif(not CAPABILITY.startswith(("AVX512", "AVX2")),
                                  reason="oneDNN's layouts were measured on AVX2 and AVX-512")


def _convolution(batch: int, channels: int, out_channels: int, size: int, kernel: int,
                 stride: int = 1, device: str = "cpu") -> tuple[tuple, tuple]:
    """(output, aten.convolution's arguments) and (grads, convolution_backward's arguments,
    grad_input and grad_weight asked for), on fake tensors: nothing is allocated."""
    with FakeTensorMode():
        x = torch.empty(batch, channels, size, size, device=device)
        w = torch.empty(out_channels, channels, kernel, kernel, device=device)
        conv = (x, w, None, [stride] * 2, [kernel // 2] * 2, [1, 1], False, [0, 0], 1)
        y = aten.convolution(*conv)
        backward = (y, x, w, None, *conv[3:], [True, True, False])
        return (y, conv), (aten.convolution_backward(*backward), backward)


def _bytes(op, made) -> int:
    result, args = made
    return workspace_bytes(op, result, args, {})


@AVX512
def test_a_convolutions_forward_holds_the_blocked_input_weight_and_output():
    forward, _ = _convolution(4, 16, 16, 32, 3)
    activation = 4 * 16 * 32 * 32 * FP32  # input and output alike: 16 channels, one block
    weight = 16 * 16 * 3 * 3 * FP32
    # Reordered input + reordered weight + blocked output at once, less the output itself
    # (counted already as the op's output): the dense output is made after 1 and 2 are freed.
    assert _bytes(aten.convolution.default, forward) == activation + weight + activation \
        - activation


@AVX512
def test_a_convolutions_backward_holds_two_of_grad_outputs_size():
    _, backward = _convolution(4, 16, 16, 32, 3)
    activation = 4 * 16 * 32 * 32 * FP32
    weight = 16 * 16 * 3 * 3 * FP32
    # While grad_weight is computed: grad_input (made first, an output), grad_output and the
    # input reordered, the blocked grad_weight; less the outputs (grad_input, grad_weight).
    held = activation + activation + activation + weight
    assert _bytes(aten.convolution_backward.default, backward) == held - activation - weight


@AVX512
def test_a_first_convolution_reads_its_input_as_it_is():
    forward, _ = _convolution(4, 3, 16, 32, 3)
    # 3 input channels, under a block: oneDNN reads the input plain; the weight (output
    # channels padded only: 16 x 3 x 3 x 3) and the blocked output, then the dense output.
    blocked_output = 4 * 16 * 32 * 32 * FP32
    weight = 16 * 3 * 3 * 3 * FP32
    assert _bytes(aten.convolution.default, forward) == \
        max(weight + blocked_output, 2 * blocked_output) - blocked_output


@AVX512
def test_channels_under_a_block_are_padded_to_it():
    forward, _ = _convolution(2, 20, 20, 16, 3)
    padded = 2 * 32 * 16 * 16 * FP32  # 20 channels in two blocks of 16
    weight = 32 * 32 * 3 * 3 * FP32
    assert _bytes(aten.convolution.default, forward) == padded + weight + padded \
        - 2 * 20 * 16 * 16 * FP32


def test_a_meta_step_runs_no_kernel_and_holds_no_workspace():
    forward, backward = _convolution(4, 16, 16, 32, 3, device="meta")
    assert _bytes(aten.convolution.default, forward) == 0
    assert _bytes(aten.convolution_backward.default, backward) == 0


def test_an_op_has_one_workspace_function():
    with pytest.raises(ValueError, match="aten.convolution.default has a workspace already"):
        workspace(aten.convolution.default)(lambda *args: 0)
    assert set(WORKSPACES) == {aten.convolution.default, aten.convolution_backward.default}


def _in_kernel(prof, name: str) -> int:
    """The most bytes allocated under the profiler's op ``name`` at once, less what it
    still holds when it returns (its outputs)."""
    def allocations(node):
        if node.tag == _EventType.Allocation:
            yield node.start_time_ns, node.extra_fields.alloc_size
        for child in node.children:
            yield from allocations(child)

    def find(nodes):
        for node in nodes:
            if node.tag == _EventType.TorchOp and node.name == name:
                return node
            found = find(node.children)
            if found is not None:
                return found
        return None

    live = most = 0
    for _, nbytes in sorted(allocations(find(prof.profiler.kineto_results
                                             .experimental_event_tree()))):
        live += nbytes
        most = max(most, live)
    return most - live


@MEASURED_ISA
@pytest.mark.parametrize("shape", [(4, 16, 16, 32, 3, 1), (4, 3, 16, 32, 3, 1),
                                   (2, 20, 20, 16, 3, 1), (2, 64, 64, 16, 3, 2)],
                         ids=["16-channels", "first", "padded", "strided"])
def test_the_workspaces_are_the_profilers_in_kernel_bytes_on_one_thread(shape):
    # One thread: oneDNN's backward-weights reduction keeps a copy of the weight per further
    # thread it splits the batch over, which is not modeled (docs/memory.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        forward, backward = _convolution(*shape)
        real = [tuple(torch.randn(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
                for _, args in (forward, backward)]
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            aten.convolution(*real[0])
            aten.convolution_backward(*real[1])
        measured = (_in_kernel(prof, "aten::convolution"),
                    _in_kernel(prof, "aten::convolution_backward"))
    finally:
        torch.set_num_threads(threads)
    assert measured == (_bytes(aten.convolution.default, forward),
                        _bytes(aten.convolution_backward.default, backward))
