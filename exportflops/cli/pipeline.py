"""``--pp N [--schedule NAME --microbatches M --rank R]``: MODEL split by layer into N stages
as torch.distributed.pipelining splits it, each stage counted on one microbatch (the example
inputs), and one step's timeline under the schedule (`exportflops.parallel.pipeline`).

Times are the roofline's on ``--device-model`` (default h100-sxm); ``--link-gbps`` delays each
received tensor by its transfer. The schedule defaults to 1f1b, the microbatches to N. N is the
pipeline ranks: the looped schedules (interleaved1f1b, loopedbfs) run two stages on each.
"""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import InputError, UsageError
from .targets import build_target, device_named, hf_options


def analyze_split(ns: argparse.Namespace):
    """(the report of rank ``ns.rank``'s first stage, (the `PipelineReport`, its view))."""
    from ..parallel.pipeline import DEFAULT_DEVICE, analyze_pipeline
    from ..parallel.schedules import SCHEDULES
    from ..render.pipeline import pipeline_view

    model, args, kwargs = build_target(ns.model, device_named("meta"), shapes=ns.shapes,
                                       kwargs=ns.kwargs, hf_options=hf_options(ns))
    schedule = ns.schedule or "1f1b"
    if schedule not in SCHEDULES:
        raise UsageError(f"--schedule {schedule}: the schedules are {', '.join(SCHEDULES)} "
                         f"(docs/pipeline.md).")
    # --pp N is the ranks; a looped schedule runs two stages on each.
    per_rank = 2 if SCHEDULES[schedule].looped else 1
    try:
        analysis = analyze_pipeline(
            model, args, kwargs, stages=ns.pp * per_rank, schedule=schedule,
            stages_per_rank=per_rank,
            microbatches=ns.microbatches, mode=ns.mode, strict=ns.strict,
            device=ns.device_model or DEFAULT_DEVICE,
            link_bytes_per_s=None if ns.link_gbps is None else ns.link_gbps * 1e9)
    except InputError as error:  # a split or schedule the flags ask for that cannot be
        raise UsageError(f"--pp {ns.pp} --schedule {schedule}: {error}") from error
    record = analysis.record
    if ns.rank >= record.pp:
        raise UsageError(f"--rank {ns.rank}: --pp {ns.pp} with schedule {schedule} has "
                         f"{record.pp} ranks, 0..{record.pp - 1}.")
    report = analysis.stage_reports[record.ranks[ns.rank].stages[0]]
    return report, (record, partial(pipeline_view, rank=ns.rank))
