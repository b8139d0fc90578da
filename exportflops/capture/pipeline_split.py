"""A model split into pipeline stages by torch.distributed.pipelining's tracer: ``pipeline()``
with a ``SplitPoint.BEGINNING`` at each module path, as a user of torch's pipelining splits it,
and the tensors each stage receives on one microbatch, with the stage each comes from.

Each stage is a ``GraphModule`` that keeps the original model's module paths
(``layers.2.attention.wq``). What a stage takes is what torch's split graph passes it: the
stage before's output, and tensors an earlier stage made that it uses too (the rotary tables
stage 0 computes go from stage 0 to every later stage directly, as torch's ``PipelineStage``
receives them). The split graph is run on the caller's inputs to make them (on meta: nothing
is computed).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch
import torch.fx

from ..errors import ExportError, InputError
from .export import buffers_kept


class Stage(NamedTuple):
    """One stage and what it receives on one microbatch."""

    module: torch.nn.Module
    args: tuple
    """Its positional inputs: the model's for stage 0, else leaves made from the senders'
    outputs (needing a gradient, with ``grad``, where the sender's output has one)."""
    kwargs: dict | None
    """Its keyword inputs (the model's, for stage 0)."""
    sources: list[int | None]
    """Per positional input, the stage that sends it; None for one of the model's inputs."""


def split_stages(model: torch.nn.Module, args: tuple, kwargs: dict | None,
                 split_points: list[str], *, grad: bool) -> list[Stage]:
    """The stages of ``model`` split before each path of ``split_points``, traced on one
    microbatch's ``args`` and ``kwargs``; ``grad``: the received tensors track gradients as
    they would in training."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    name = type(model).__name__
    names = {path for path, _ in model.named_modules()}
    missing = [path for path in split_points if path not in names]
    if missing:
        raise InputError(f"{name} has no module {missing[0]!r} to split the pipeline at; give "
                         f"paths as model.named_modules() lists them.")
    # pipeline() wraps each split module's forward in place and leaves it wrapped (torch 2.13,
    # _IR.annotate_split_points): the caller's model gets its own attributes back.
    wrapped = [model.get_submodule(path) for path in split_points]
    saved = [{key: vars(m)[key] for key in ("forward", "_orig_forward") if key in vars(m)}
             for m in wrapped]
    try:
        with warnings.catch_warnings():
            # torch's own copy of its pytree specs warns of torch's deprecation (2.13).
            warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
            pipe = pipeline(model, mb_args=tuple(args), mb_kwargs=kwargs or None,
                            split_spec={path: SplitPoint.BEGINNING for path in split_points})
    except Exception as error:  # torch's tracer refuses the model
        raise ExportError(
            name, f"{type(error).__name__}: {error}",
            f"torch.distributed.pipelining.pipeline() traces the model with torch.export to "
            f"split it at {', '.join(split_points)}: build the stage modules yourself and pass "
            f"them as stages=[...].") from error
    finally:
        for module, attributes in zip(wrapped, saved):
            for key in ("forward", "_orig_forward"):
                vars(module).pop(key, None)
            vars(module).update(attributes)
    if pipe.num_stages != len(split_points) + 1:
        raise InputError(f"splitting {name} at {', '.join(split_points)} gave "
                         f"{pipe.num_stages} stages, not {len(split_points) + 1}: a split point "
                         f"is never called, or two fall at the same place; give split points "
                         f"that each start a stage of their own.")
    modules = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
    recorder = _Recorder(pipe.split_gm, {id(m): i for i, m in enumerate(modules)}, grad)
    cuda = {p.device for p in model.parameters() if p.device.type == "cuda"}
    # On a real model the run computes: its batch norms' statistics and random draws are put
    # back as they were.
    with torch.enable_grad() if grad else torch.no_grad(), buffers_kept(model), \
            torch.random.fork_rng(devices=sorted(cuda, key=str)):
        recorder.run(*args, *(kwargs or {}).values())
    return [Stage(module, *recorder.calls[i]) for i, module in enumerate(modules)]


class _Recorder(torch.fx.Interpreter):
    """Runs torch's split graph, keeping what each stage is called with and who made it."""

    def __init__(self, split: torch.fx.GraphModule, index: dict[int, int], grad: bool) -> None:
        super().__init__(split)
        self.index, self.grad = index, grad
        self.made_by: dict[int, int] = {}  # id of a stage's output tensor -> the stage
        self.calls: dict[int, tuple[tuple, dict | None, list[int | None]]] = {}

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        module = self.fetch_attr(target)
        stage = self.index.get(id(module))
        if stage is None:
            return super().call_module(target, args, kwargs)
        if stage == 0:  # the model's own inputs, as the caller gave them
            received, sources = args, [None] * len(args)
        else:
            received = tuple(as_received(a, self.grad) for a in args)
            sources = [self.made_by.get(id(a)) for a in args]
        self.calls[stage] = (received, kwargs or None, sources)
        out = module(*received, **kwargs)
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.made_by[id(tensor)] = stage
        # The next stages get the real outputs (ids kept), each stage its own leaves.
        return out


def as_received(value: Any, grad: bool) -> Any:
    """A tensor as the next stage receives it: a leaf, needing a gradient (``grad``) where
    the sender's output has one."""
    if not isinstance(value, torch.Tensor):
        return value
    needs = grad and value.requires_grad and value.is_floating_point()
    return value.detach().requires_grad_(needs)
