"""Bytes a cpu kernel allocates for itself and frees before it returns: below the dispatch level
the step is recorded at (no op returns them), yet the allocator holds them while the kernel
runs, on top of its inputs and outputs.

One registry, op -> a pure function of the op's result and arguments (shapes, strides, dtypes)
giving the most bytes the kernel holds at once besides its outputs. `step` counts them as
``temporaries`` at that op only, and only where the op's tensors are on cpu: a meta step runs
no kernel, and CUDA kernels' workspaces (cuDNN's, cuBLAS's) are not modeled (docs/memory.md).

oneDNN's convolutions (the ``Mkldnn`` backend, `torch._C._select_conv_backend`), in
aten/src/ATen/native/mkldnn/Conv.cpp: a contiguous (NCHW) tensor is reordered into oneDNN's
blocked layout (``nChw16c`` with AVX-512, its channels padded to the block) before the
primitive runs, the result is computed blocked and copied back into the dense output
(``mkldnn_to_dense``); a channels-last tensor is viewed as it is, and only the weight is
reordered. The layouts were read from oneDNN's verbose log (``ONEDNN_VERBOSE=1``) and the
bytes from torch's profiler on an AVX-512 cpu with oneDNN 3.12, and on the same cpu limited to
AVX2 (docs/memory.md lists the cases measured and those that differ).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..torch_internals import pytree, require

#: The dtypes whose oneDNN convolution forward holds the bytes below, as measured; a bfloat16
#: backward holds more, in buffers oneDNN sizes itself, and is not modeled.
_FORWARD_DTYPES = (torch.float32, torch.bfloat16)

Workspace = Callable[..., int]
WORKSPACES: dict[Any, Workspace] = {}


def workspace(op: Any) -> Callable[[Workspace], Workspace]:
    """Registers the workspace of ``op``'s cpu kernel; one function per op."""
    def register(function: Workspace) -> Workspace:
        if op in WORKSPACES:
            raise ValueError(f"{op} has a workspace already: {WORKSPACES[op].__name__}")
        WORKSPACES[op] = function
        return function
    return register


def workspace_bytes(func: Any, result: Any, args: tuple, kwargs: dict) -> int:
    """The bytes ``func``'s kernel holds besides its outputs at its most, 0 for an op with no
    workspace or whose tensors are not all on cpu."""
    function = WORKSPACES.get(func)
    if function is None:
        return 0
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        return 0
    return function(result, *args, **kwargs)


def channel_block() -> int:
    """The channels of oneDNN's blocked layouts on this cpu: 16 floats fill an AVX-512 register
    (``nChw16c``, as the verbose log shows), 8 an AVX2 one (``nChw8c``, as it shows under
    ``ONEDNN_MAX_CPU_ISA=AVX2``). ATen's capability stands for oneDNN's ISA: both are read from
    the cpu, unless ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` set them apart."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _padded(channels: int, block: int) -> int:
    return -(-channels // block) * block


def _blocked(tensor: torch.Tensor, block: int) -> int:
    """Bytes of an activation in oneDNN's blocked layout: its channels (dim 1) padded."""
    others = math.prod(tensor.shape) // tensor.shape[1] if tensor.shape[1] else 0
    return others * _padded(tensor.shape[1], block) * tensor.element_size()


def _weight(weight: torch.Tensor, block: int, first: bool) -> int:
    """Bytes of a weight in oneDNN's blocked layout: output channels padded, input channels
    too unless the convolution is a first one (``Acdb16a``, against ``ABcd16b16a``)."""
    out_channels, in_channels, *kernel = weight.shape
    in_channels = in_channels if first else _padded(in_channels, block)
    return _padded(out_channels, block) * in_channels * math.prod(kernel) * weight.element_size()


def _on_mkldnn(dtypes: tuple[torch.dtype, ...], input: torch.Tensor, weight: torch.Tensor,
               stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
               transposed: bool, output_padding: Sequence[int], groups: int,
               bias_sizes: Sequence[int] | None) -> bool:
    """Whether torch's cpu convolution runs this one on oneDNN, a plain 2-d one in one of
    ``dtypes`` (grouped, 3-d and transposed convolutions block otherwise, and are not
    modeled)."""
    if input.dtype not in dtypes or input.dim() != 4 or groups != 1 or transposed:
        return False
    backend = require("select_conv_backend")(input, weight, None, list(stride), list(padding),
                                             list(dilation), transposed, list(output_padding),
                                             groups, bias_sizes)
    return backend == require("ConvBackend").Mkldnn


def _channels_last(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """``mkldnn_conv_use_channels_last`` (aten/src/ATen/native/ConvUtils.h): either tensor in
    channels-last suggests it, and then both are made channels-last."""
    last = torch.channels_last
    return any(t.is_contiguous(memory_format=last) and not t.is_contiguous()
               for t in (input, weight))


def _copies(channels_last: bool, *tensors: torch.Tensor) -> int:
    """Bytes of ``tensor.contiguous(memory_format)`` for each tensor not laid out so (Conv.cpp
    makes the input, the weight and grad_output so first)."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return sum(t.numel() * t.element_size() for t in tensors
               if not t.is_contiguous(memory_format=layout))


def _nbytes(tensor: torch.Tensor | None) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


@workspace(torch.ops.aten.convolution.default)
def mkldnn_convolution(output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None, stride: Sequence[int], padding: Sequence[int],
                       dilation: Sequence[int], transposed: bool,
                       output_padding: Sequence[int], groups: int) -> int:
    """``mkldnn_convolution``: 1. the input reordered blocked (kept plain by a first
    convolution, fewer input channels than a block: oneDNN reads it as it is), 2. the weight
    reordered, 3. the output computed blocked; then 1 and 2 are freed and 3 is copied into the
    dense output. Channels-last: the weight's reorder only."""
    bias_sizes = list(bias.shape) if bias is not None else None
    if not _on_mkldnn(_FORWARD_DTYPES, input, weight, stride, padding, dilation, transposed,
                      output_padding, groups, bias_sizes):
        return 0
    block = channel_block()
    first = input.shape[1] < block
    channels_last = _channels_last(input, weight)
    copies = _copies(channels_last, input, weight)
    if channels_last:
        return copies + _weight(weight, block, first=False)
    blocked_output = _blocked(output, block)
    reorders = (0 if first else _blocked(input, block)) + _weight(weight, block, first)
    return copies + max(reorders + blocked_output, blocked_output + _nbytes(output)) \
        - _nbytes(output)


@workspace(torch.ops.aten.convolution_backward.default)
def mkldnn_convolution_backward(
        grads: tuple[torch.Tensor | None, ...], grad_output: torch.Tensor, input: torch.Tensor,
        weight: torch.Tensor, bias_sizes: Sequence[int] | None, stride: Sequence[int],
        padding: Sequence[int], dilation: Sequence[int], transposed: bool,
        output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]) -> int:
    """``mkldnn_convolution_backward``: grad_input first, then grad_weight (and grad_bias)
    while grad_input is held; the most of the two, less the outputs."""
    if not _on_mkldnn((torch.float32,), input, weight, stride, padding, dilation, transposed,
                      output_padding, groups, bias_sizes):
        return 0
    grad_input, grad_weight, grad_bias = grads
    block = channel_block()
    channels_last = _channels_last(input, weight)
    held = _nbytes(grad_input)
    most = max(_grad_input(grad_output, weight, grad_input, block, channels_last)
               if output_mask[0] else 0,
               held + _grad_weight(grad_output, input, weight, grad_weight, grad_bias, block,
                                   channels_last) if output_mask[1] or output_mask[2] else 0)
    return (_copies(channels_last, grad_output, input, weight) + most
            - held - _nbytes(grad_weight) - _nbytes(grad_bias))


def _grad_input(grad_output: torch.Tensor, weight: torch.Tensor, grad_input: torch.Tensor,
                block: int, channels_last: bool) -> int:
    """The most ``mkldnn_convolution_backward_input`` holds, grad_input included: grad_output
    and the weight reordered, grad_input computed blocked, then copied dense. Channels-last:
    the weight's reorder, grad_input computed in place."""
    weight_reorder = _weight(weight, block, first=False)
    if channels_last:
        return weight_reorder + _nbytes(grad_input)
    blocked = _blocked(grad_input, block)
    return max(_blocked(grad_output, block) + weight_reorder + blocked,
               blocked + _nbytes(grad_input))


def _grad_weight(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                 grad_weight: torch.Tensor | None, grad_bias: torch.Tensor | None, block: int,
                 channels_last: bool) -> int:
    """The most ``mkldnn_convolution_backward_weights`` holds, its outputs included:
    grad_output and the input reordered (a first convolution's input read as it is),
    grad_weight and grad_bias computed blocked, then copied dense. Channels-last: nothing
    reordered; the blocked and the dense grad_weight live as the channels-last one returned
    is made of them."""
    first = input.shape[1] < block
    blocked = _weight(weight, block, first) + (
        _padded(weight.shape[0], block) * weight.element_size() if grad_bias is not None else 0)
    if channels_last:
        return blocked + 2 * _nbytes(grad_weight) + _nbytes(grad_bias)
    reorders = _blocked(grad_output, block) + (0 if first else _blocked(input, block))
    return max(reorders + blocked, blocked + _nbytes(grad_weight) + _nbytes(grad_bias))
