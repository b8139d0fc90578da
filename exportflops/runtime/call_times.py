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

With the backward split (a zero-bubble schedule's stage), it runs as torch's pipeline stage
runs it, by torch's own functions (torch/distributed/pipelining/_backward.py): the input pass
``stage_backward_input`` (the received inputs' gradients, saving those the parameters need),
then the weight pass ``stage_backward_weight``, each timed; a call whose inputs need no
gradient, and a pipeline's first stage (``whole``: torch's ``backward_one_chunk`` skips the
input pass on stage 0), has an empty input pass and its whole backward in the weight pass.
These accumulate into ``.grad``: each parameter's and input's ``.grad`` is set aside before each
iteration and put back after it, outside the clock (the user's gradient tensors are never
written).
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

import torch

from ..torch_internals import pytree
from .timing import CpuClock, CudaClock


def call_seconds(module: torch.nn.Module, args: tuple, kwargs: dict | None, *, train: bool,
                 warmup: int, repeat: int, split: bool = False,
                 whole: bool = False) -> dict[str, float]:
    """Median seconds of ``module(*args, **kwargs)``'s forward ``F`` and backward ``B`` (0
    unless ``train``), keyed as torch's pipeline actions; with ``split`` its input pass ``I``
    and weight pass ``W`` too, ``B`` their sum (``whole``: all of it in ``W``, as torch runs a
    first stage)."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs, *module.parameters(),
                                              *module.buffers()))
               if isinstance(t, torch.Tensor)]
    cuda = sorted({t.device for t in tensors if t.device.type == "cuda"}, key=str)
    clock = CudaClock(0) if cuda else CpuClock(0)
    wrt = [t for t in tensors if t.requires_grad]
    inputs = [t for t in pytree.tree_leaves((args, kwargs))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    weights = [p for p in module.parameters() if p.requires_grad]
    # Put back after each iteration, outside the clock: a forward's writes to its buffers,
    # and the weight pass's to .grad.
    saved = [(b, b.clone()) for b in module.buffers()]
    grads = [(t, t.grad) for t in wrt]
    times: dict[str, list[float]] = {kind: [] for kind in ("FIW" if split else "FB")}
    with torch.random.fork_rng(devices=cuda), \
            torch.cuda.device(cuda[0]) if cuda else contextlib.nullcontext():
        for iteration in range(warmup + repeat):
            for tensor, _ in grads:
                tensor.grad = None
            outputs: list[Any] = []
            with torch.enable_grad() if train else torch.no_grad():
                forward = clock.whole(lambda: outputs.append(module(*args, **(kwargs or {}))))
            if not train:
                backward = {kind: (lambda: 0.0) for kind in times if kind != "F"}
            elif split:
                backward = _two_passes(clock, outputs[0], [] if whole else inputs, weights,
                                       wrt)
            else:
                backward = {"B": _backward(clock, outputs[0], wrt)}
            clock.synchronize()
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)
            for tensor, grad in grads:
                tensor.grad = grad
            if iteration >= warmup:
                for kind, read in {"F": forward, **backward}.items():
                    times[kind].append(read())
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    return {**medians, "B": medians["I"] + medians["W"]} if split else medians


def _two_passes(clock: CpuClock, output: Any, inputs: list[torch.Tensor],
                weights: list[torch.nn.Parameter], wrt: list[torch.Tensor]) -> dict[str, Any]:
    """Run and time torch's input pass, then its weight pass, from ``output``'s tensors that
    have a gradient (seeded with ones); with no ``inputs``, the whole backward (the gradients
    of ``wrt``) in the weight pass."""
    from torch.distributed.pipelining._backward import (stage_backward_input,
                                                        stage_backward_weight)

    roots = _roots(output)
    if not inputs or not roots:  # torch's first stage: the whole backward in the weight pass
        return {"I": lambda: 0.0, "W": _backward(clock, output, wrt)}
    seeds = [torch.ones_like(t) for t in roots]
    groups: list = []
    input_pass = clock.whole(lambda: groups.append(
        stage_backward_input(roots, seeds, inputs, iter(weights))[1]))
    weight_pass = clock.whole(lambda: stage_backward_weight(iter(weights), groups[0]))
    return {"I": input_pass, "W": weight_pass}


def _backward(clock: CpuClock, output: Any, wrt: list[torch.Tensor]):
    """Run and time the gradients of ``wrt`` from ``output``'s tensors that have a gradient."""
    roots = _roots(output)
    if not roots or not wrt:
        return lambda: 0.0
    seeds = [torch.ones_like(t) for t in roots]
    return clock.whole(lambda: torch.autograd.grad(roots, wrt, seeds, allow_unused=True))


def _roots(output: Any) -> list[torch.Tensor]:
    """The tensors of ``output`` a backward starts from: those that have a gradient."""
    return [t for t in pytree.tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.requires_grad]
