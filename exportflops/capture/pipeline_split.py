"""A model split into pipeline stages by torch.distributed.pipelining's tracer: ``pipeline()``
with a ``SplitPoint.BEGINNING`` at each module path, as a user of torch's pipelining splits it.

Each stage is a ``GraphModule`` that keeps the original model's module paths
(``layers.2.attention.wq``); the activations it takes are what the stage before returns (torch
passes the rotary tables and masks the later stages need along with the hidden state).
"""

from __future__ import annotations

import torch

from ..errors import ExportError


def split_stages(model: torch.nn.Module, args: tuple, kwargs: dict | None,
                 split_points: list[str]) -> list[torch.nn.Module]:
    """The stage modules of ``model`` split before each path of ``split_points``, traced on one
    microbatch's ``args`` and ``kwargs``."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    names = {name for name, _ in model.named_modules()}
    missing = [path for path in split_points if path not in names]
    if missing:
        raise ExportError(f"{type(model).__name__} has no module {missing[0]!r} to split the "
                          f"pipeline at; give paths as model.named_modules() lists them.")
    # pipeline() wraps each split module's forward in place and leaves it wrapped (torch 2.13,
    # _IR.annotate_split_points): the caller's model gets its own attributes back.
    wrapped = [model.get_submodule(path) for path in split_points]
    saved = [{key: vars(m)[key] for key in ("forward", "_orig_forward") if key in vars(m)}
             for m in wrapped]
    try:
        pipe = pipeline(model, mb_args=tuple(args), mb_kwargs=kwargs or None,
                        split_spec={path: SplitPoint.BEGINNING for path in split_points})
    except Exception as error:  # torch's tracer refuses the model
        raise ExportError(f"torch.distributed.pipelining.pipeline() could not split "
                          f"{type(model).__name__} at {', '.join(split_points)}: "
                          f"{type(error).__name__}: {error}. Build the stage modules yourself "
                          f"and pass them as stages=[...].") from error
    finally:
        for module, attributes in zip(wrapped, saved):
            for key in ("forward", "_orig_forward"):
                vars(module).pop(key, None)
            vars(module).update(attributes)
    if pipe.num_stages != len(split_points) + 1:
        raise ExportError(f"splitting {type(model).__name__} at {', '.join(split_points)} gave "
                          f"{pipe.num_stages} stages, not {len(split_points) + 1}: a split "
                          f"point is never called, or two fall at the same place.")
    return [pipe.get_stage_module(i) for i in range(pipe.num_stages)]

