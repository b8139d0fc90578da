"""One rank of tensor parallelism and FSDP2 on a `Layout`, counted (`counted_rank_of`) and
reported (`rank_of`, which `exportflops.parallel.analyze_ranks` calls).

A rank of tensor parallelism and FSDP2 (``Layout(fsdp=F, tp=T)``) is counted as torchtitan runs
it: under a fake process group standing for the rank (`exportflops.fake_process_group`), the
layout's mesh built (`Layout.mesh`), a copy of the model split on it (`parallelize`: the plan
on ``tp``, FSDP2 on ``fsdp``) and analyzed (`exportflops.analyze` captures the rank through
``capture.dtensor``/``capture.fsdp``). The caller's model is left as it was: a model on meta is
copied (nothing is allocated), any other onto fake tensors, and so is one FSDP2 shards (FSDP2
refuses meta parameters).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ..aggregate import Counted, build_report
from ..api import count_call
from ..count.ranks import fake_copy
from ..errors import InputError
from ..records import Report
from .layout import Layout
from .parallelize import parallelize

#: A model given as a function of the device to build it on: (model, args, kwargs).
Builder = Callable[[torch.device], tuple]


def rank_of(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None, layout: Layout,
            **options: Any) -> tuple[torch.nn.Module, Report]:
    """(the model as the rank holds it, its report): `counted_rank_of`, which takes
    ``options``, built into a report."""
    built, counted = counted_rank_of(model, args, kwargs, layout, **options)
    return built, build_report(counted)


def counted_rank_of(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                    layout: Layout, *, rank: int, dims: tuple[str, ...] | None = None,
                    fake: bool = False, experts: str | None = None,
                    shard: Callable[[torch.nn.Module, Any], None] | None = None,
                    inputs: Callable[[tuple, dict | None], tuple] | None = None,
                    **analyze_options: Any) -> tuple[torch.nn.Module, Counted]:
    """(the model as ``rank`` holds it, its count before it is a report:
    `exportflops.api.count_call`) on ``layout``'s mesh of ``dims`` (default: ``fsdp`` and
    ``tp`` where split; ``rank`` is a rank of those dimensions). The caller's model is left
    as it was (module docstring). ``fake``: copied onto fake cpu tensors even without FSDP2
    (on meta, attention is traced as its math decomposition; on cpu as one kernel call, as
    ring attention needs). ``experts``, ``shard``: as `parallelize` takes them;
    ``inputs(args, kwargs)`` gives the inputs to count instead."""
    if dims is None:
        dims = tuple(name for name in ("fsdp", "tp") if getattr(layout, name) > 1)
    with layout.mesh(*dims, rank=rank) as mesh:
        built, args, kwargs = built_model(model, args, kwargs)
        if inputs is not None:
            args, kwargs = inputs(args, kwargs)
        if fake or "fsdp" in dims or not _on_meta(built):
            built, args, kwargs = fake_copy(built, args, kwargs or {})
        elif built is model:  # the caller's model, on meta: copied, nothing allocated
            built = copy.deepcopy(built)
        parallelize(built, mesh, experts=experts, shard=shard)
        return built, count_call(built, args, kwargs, **analyze_options)


def built_model(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None) -> tuple:
    """(model, args, kwargs): ``model`` itself, or what the builder makes on meta."""
    if isinstance(model, torch.nn.Module):
        return model, args if isinstance(args, tuple) else (args,), kwargs
    if not callable(model):
        raise InputError(f"analyze_ranks takes a torch.nn.Module or a function device -> "
                         f"(model, args, kwargs), got {type(model).__name__}.")
    built = model(torch.device("meta"))
    if not (isinstance(built, tuple) and len(built) == 3
            and isinstance(built[0], torch.nn.Module)):
        raise InputError(f"analyze_ranks' model function must return (model, args, kwargs), "
                         f"got {type(built).__name__}.")
    return built


def _on_meta(model: torch.nn.Module) -> bool:
    return all(p.device.type == "meta" for p in [*model.parameters(), *model.buffers()])
