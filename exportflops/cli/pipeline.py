"""``--pp N [--schedule NAME --microbatches M --rank R]``: MODEL split by layer into N stages
as torch.distributed.pipelining splits it, each stage counted on one microbatch (the example
inputs), and one step's timeline under the schedule (`exportflops.parallel.pipeline`).

Times are the roofline's on ``--device-model`` (default h100-sxm), or with ``--profile`` (the
model built on ``--device cpu`` or ``cuda``) each stage's measured forward and backward
(``--warmup``, ``--repeat``); ``--link-gbps`` delays each received tensor by its transfer.
The schedule defaults to 1f1b, the microbatches to N. N is the pipeline ranks: the looped
schedules (interleaved1f1b, loopedbfs, the zero-bubble ones and dualpipev) run two stages on
each.

With ``--tp T`` and/or ``--fsdp F`` the ranks are the mesh (pp, fsdp, tp), tp innermost as
torchtitan lays it out, each stage counted once as the rank of its (fsdp, tp) group with index
0 (`exportflops.parallel.pipeline.ranks` on the flags' `Layout`). ``--rank R`` is a global
rank of that mesh (docs/pipeline.md, Composition).
"""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``'s first stage, (the `PipelineReport`, its view))."""
    from ..parallel.pipeline.analysis import DEFAULT_DEVICE
    from ..parallel.pipeline.ranks import analyze_pipeline_ranks
    from ..parallel.pipeline.mesh import rank_report
    from ..render.pipeline import pipeline_view
    from .splits import split_layout

    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes,
                                       kwargs=ns.kwargs, hf_options=hf_options(ns))
    layout = split_layout(ns)
    try:
        analysis = analyze_pipeline_ranks(
            model, args, kwargs, layout=layout, schedule=ns.schedule,
            microbatches=ns.microbatches, mode=ns.mode, strict=ns.strict,
            device=ns.device_model or DEFAULT_DEVICE,
            link_bytes_per_s=None if ns.link_gbps is None else ns.link_gbps * 1e9,
            measure=ns.profile, warmup=ns.warmup, repeat=ns.repeat)
    except InputError as error:  # a split or schedule the flags ask for that cannot be
        raise UsageError(f"--pp {ns.pp} --schedule {ns.schedule or '1f1b'}: {error}") \
            from error
    record = analysis.record
    pipeline_rank = layout.coordinates(ns.rank)["pp"]
    return rank_report(analysis, ns.rank), (record, partial(pipeline_view, rank=pipeline_rank))
