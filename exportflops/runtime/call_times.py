"""Measured seconds of one module call, forward and backward: what a pipeline stage takes per
microbatch when its timeline is measured rather than predicted (`exportflops.parallel.pipeline`).

Each of ``warmup + repeat`` iterations runs the forward, then (in training) the gradients of the
call's parameters and of its inputs that need one, from its floating outputs seeded with ones,
each timed by the profiler's clock (``perf_counter_ns``, or a pair of CUDA events read after one
synchronize per iteration); the medians of the last ``repeat`` are kept. Nothing of the user's
is left changed: the gradients are returned by ``torch.autograd.grad``, not accumulated in
``.grad``; the buffers a forward writes (batch norm's running statistics) are put back after
each iteration, outside the clock; random draws (dropout) come from a forked generator. On
CUDA the clock runs on the stage's device.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

import torch

from ..torch_internals import pytree
from .timing import CpuClock, CudaClock


def call_seconds(module: torch.nn.Module, args: tuple, kwargs: dict | None, *, train: bool,
                 warmup: int, repeat: int) -> tuple[float, float]:
    """(forward, backward) median seconds of ``module(*args, **kwargs)``; backward 0 unless
    ``train``."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs, *module.parameters(),
                                              *module.buffers()))
               if isinstance(t, torch.Tensor)]
    cuda = sorted({t.device for t in tensors if t.device.type == "cuda"}, key=str)
    clock = CudaClock(0) if cuda else CpuClock(0)
    wrt = [t for t in tensors if t.requires_grad]
    # Put back after each iteration, outside the clock: a forward's writes to its buffers.
    saved = [(b, b.clone()) for b in module.buffers()]
    forwards, backwards = [], []
    with torch.random.fork_rng(devices=cuda), \
            torch.cuda.device(cuda[0]) if cuda else contextlib.nullcontext():
        for iteration in range(warmup + repeat):
            outputs: list[Any] = []
            with torch.enable_grad() if train else torch.no_grad():
                forward = clock.whole(lambda: outputs.append(module(*args, **(kwargs or {}))))
            backward = _backward(clock, outputs[0], wrt) if train else (lambda: 0.0)
            clock.synchronize()
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)
            if iteration >= warmup:
                forwards.append(forward())
                backwards.append(backward())
    return statistics.median(forwards), statistics.median(backwards)


def _backward(clock: CpuClock, output: Any, wrt: list[torch.Tensor]):
    """Run and time the gradients of ``wrt`` from ``output``'s tensors that have a gradient."""
    roots = [t for t in pytree.tree_leaves(output)
             if isinstance(t, torch.Tensor) and t.requires_grad]
    if not roots or not wrt:
        return lambda: 0.0
    seeds = [torch.ones_like(t) for t in roots]
    return clock.whole(lambda: torch.autograd.grad(roots, wrt, seeds, allow_unused=True))
