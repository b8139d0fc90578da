"""Pooling: one compare (max) or add (avg) per window element, windows counted whole.

Like convolution, a window that overlaps padding is counted at full kernel size. Average pooling
adds ``k - 1`` values and divides once: ``k`` FLOPs per output; max pooling compares ``k - 1``.
Fractional max pooling compares the same over windows whose starts it draws per plane.
"""

from __future__ import annotations

import math


from ..errors import FormulaError
from .registry import Cost, OpCall, register_formula, aten


def _kernel_elements(call: OpCall, spatial_dims: int):
    kernel = list(call["kernel_size"])
    return math.prod(kernel * spatial_dims if len(kernel) == 1 else kernel)


def _spatial_dims(op) -> int:
    return int(op.__name__.split("pool")[1][0])


@register_formula(aten.max_pool1d, aten.max_pool2d, aten.max_pool3d, aten.max_pool1d_with_indices,
                  aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)
def max_pool(call: OpCall) -> Cost:
    window = _kernel_elements(call, _spatial_dims(call.op))
    return call.cost(flops=call.out.numel * (window - 1))


@register_formula(aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d)
def avg_pool(call: OpCall) -> Cost:
    window = _kernel_elements(call, _spatial_dims(call.op))
    return call.cost(flops=call.out.numel * window)


def adaptive_window_elements(in_size, out_size):
    """Sum over the output positions of one dim of their window length.

    torch's adaptive pools use window j = [floor(j*I/O), ceil((j+1)*I/O)).
    """
    if out_size == 1 or in_size == out_size:
        return in_size
    if not (isinstance(in_size, int) and isinstance(out_size, int)):
        raise FormulaError(
            f"adaptive pooling from {in_size} to {out_size}: window sizes need concrete sizes"
        )
    return sum(-(-(j + 1) * in_size // out_size) - j * in_size // out_size for j in range(out_size))


def _adaptive_reads(call: OpCall):
    x, out = call["self"], call.out
    dims = len(call["output_size"])
    channels = math.prod(x.shape[:-dims])
    return channels * math.prod(adaptive_window_elements(i, o)
                                for i, o in zip(x.shape[-dims:], out.shape[-dims:]))


@register_formula(aten.adaptive_avg_pool1d, aten.adaptive_avg_pool2d, aten.adaptive_avg_pool3d,
                  aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d)
def adaptive_avg_pool(call: OpCall) -> Cost:
    # Window elements added, one divide per output: sum of (len - 1) + 1 = sum of len.
    return call.cost(flops=_adaptive_reads(call))


@register_formula(aten.adaptive_max_pool1d, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool(call: OpCall) -> Cost:
    return call.cost(flops=_adaptive_reads(call) - call.out.numel)


@register_formula(aten.fractional_max_pool2d, aten.fractional_max_pool3d)
def fractional_max_pool(call: OpCall) -> Cost:
    """Max pooling over ``kernel_size`` windows, plus the window starts ATen's
    ``generate_intervals`` draws per plane (batch x channel) and spatial dim from
    ``random_samples``: alpha = (in - k) / (out - 1) once (1 FLOP) and
    ``(i + sample) * alpha - sample * alpha`` for each start but the last (3 FLOPs)."""
    dims = _spatial_dims(call.op)
    out_sizes = call.out.shape[-dims:]
    planes = math.prod(call.out.shape[:-dims])
    starts = planes * sum(3 * (size - 1) + 1 for size in out_sizes)
    return max_pool(call) + Cost(flops=starts)
