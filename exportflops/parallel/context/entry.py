"""`analyze_context`, the public entry point of context parallelism: on a `Layout` (rings of
``cp`` ranks with fsdp and tp, `exportflops.parallel.context.ranks`), or on ``cp`` ranks alone
or inside ``fsdp`` FSDP2 ranks with the batch and sequence dimensions named yourself
(`count_context`)."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import LayoutError
from ...records.context import ContextParallelReport
from ..checks import check_call
from ..layout import Layout
from .analysis import count_context
from .ranks import analyze_context_ranks


def analyze_context(model: torch.nn.Module, args: Any = (), kwargs: dict | None = None, *,
                    layout: Layout | None = None, cp: int | None = None,
                    fsdp: int | None = None, load_balance: bool = True, mode: str = "forward",
                    **options: Any) -> ContextParallelReport:
    """Every rank's work and ring traffic when the sequence of ``model``'s example is split
    over the ranks of a ring (`count_context`'s module docstring): it must split into 2 x cp
    equal chunks (cp without ``load_balance``).

    ``layout``: a `Layout` with ``cp`` (and ``fsdp``, ``tp`` on torchtitan's mesh (fsdp, cp,
    tp)), ``options`` going to `exportflops.analyze` (``strict``). Or ``cp`` (and ``fsdp``)
    without a layout, ``options`` as `count_context` takes them (``dynamic_shapes``,
    ``batch_dim``, ``seq_dim``, ``formulas``)."""
    if layout is None:
        if cp is None:
            raise LayoutError("analyze_context takes layout=Layout(..., cp=N) (or cp=N, and "
                              "fsdp=F, without a layout).")
        return count_context(model, args, kwargs, cp=cp, fsdp=fsdp, load_balance=load_balance,
                             mode=mode, **options)
    if cp is not None or fsdp is not None:
        raise LayoutError(f"analyze_context(layout={layout}) takes its degrees from the layout: "
                          f"leave out cp= and fsdp=.")
    check_call(layout, load_balance=load_balance)
    return analyze_context_ranks(model, args, kwargs, layout=layout, mode=mode,
                                 load_balance=load_balance, **options)[0]
