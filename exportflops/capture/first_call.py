"""The arguments a model passes to a module of a given class, read by tracing the model with
``torch.export`` up to that module's first call. The trace, not a plain run under fake tensors:
export's own tracing passes where such a run stops on a size read from a tensor (SAM 3's DETR
decoder, before its mask decoder, sizes a mask by its feature map's ``spatial_shapes``)."""

from __future__ import annotations

from typing import Any

import torch


class _Reached(Exception):
    """Raised by the hook at the module's first call: the trace has what it came for."""


def first_call(model: torch.nn.Module, args: tuple, kwargs: dict,
               module_class: type) -> tuple[tuple, dict[str, Any]] | None:
    """The ``(args, kwargs)`` of ``model``'s first call of a module of ``module_class`` when
    torch.export traces its forward (fake tensors of the trace); None when it makes none. A
    failure of the trace before that call is raised."""
    modules = [m for m in model.modules() if type(m) is module_class]
    seen = []

    def hook(_module, call_args, call_kwargs):
        seen.append((call_args, call_kwargs))
        raise _Reached

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        torch.export.export(model, args, kwargs, strict=False)
    except Exception:  # the hook's _Reached, as export wraps it; else the model's failure
        if not seen:
            raise
    finally:
        for handle in handles:
            handle.remove()
    return seen[0] if seen else None
