"""`analyze_experts`, the public entry point of expert parallelism: on a `Layout` (any
composition with fsdp and tp, `exportflops.parallel.experts.ranks`), or on ``ep`` ranks
alone or inside ``fsdp`` FSDP2 ranks with the MoE sizes given yourself (`count_experts`)."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import LayoutError
from ...records.experts import ExpertParallelReport
from ..checks import check_call
from ..layout import Layout
from .analysis import count_experts
from .ranks import analyze_expert_ranks


def analyze_experts(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                    layout: Layout | None = None, ep: int | None = None,
                    fsdp: int | None = None, mode: str = "forward",
                    routing: list[int] | None = None, experts: str = "experts",
                    **options: Any) -> ExpertParallelReport:
    """Each rank of ``model``'s experts sharded over expert-parallel ranks, each running a
    batch like ``args``: its expert work, the rest of its work, its dispatch and combine
    all-to-alls per MoE layer (and FSDP2's collectives, and with tp its tensor-parallel
    rank's work and collectives).

    ``layout``: a `Layout` with ``ep`` (``Layout(dp=E, ep=E)`` alone, ``fsdp`` and ``tp`` as
    torchtitan composes them), ``options`` going to `exportflops.analyze` (``strict``). Or
    ``ep`` (and ``fsdp``, a multiple of it) without a layout, ``options`` as `count_experts`
    takes them (``top_k``, ``num_experts``, ``hidden``, ``tokens`` instead of the model's
    config). ``routing``: token copies per expert summed over one expert-parallel group's
    batches (default balanced); ``experts``: the last path component of each MoE layer's
    experts."""
    if layout is None:
        if ep is None:
            raise LayoutError("analyze_experts takes layout=Layout(..., ep=E) (or ep=E, and "
                              "fsdp=F, without a layout).")
        return count_experts(model, args, kwargs, ep=ep, fsdp=fsdp, mode=mode, routing=routing,
                             experts=experts, **options)
    if ep is not None or fsdp is not None:
        raise LayoutError(f"analyze_experts(layout={layout}) takes its degrees from the layout: "
                          f"leave out ep= and fsdp=.")
    check_call(layout, routing=routing)
    return analyze_expert_ranks(model, args, kwargs, layout=layout, mode=mode, routing=routing,
                                experts=experts, **options)[0]
