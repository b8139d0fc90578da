"""The split flags' analyses (--tp, --fsdp, --pp, --ep, --cp; their options' help and
docs/parallel.md say what each gives), each `exportflops.parallel.analyze_ranks` on the flags'
`Layout` (`splits.split_layout`), its errors naming the flags (`splits.split_flagged`).
``--rank R`` is a global rank of the layout: the one reported, or whose collectives the view
lists."""

from __future__ import annotations

import argparse
from functools import partial

from ..outputs import Results
from .splits import split_flagged, split_layout, split_options
from .targets import analyzed, built


def analyze_parallelized(ns: argparse.Namespace):
    """(the report of rank ``ns.rank`` of MODEL at ``--tp`` and ``--fsdp``, each module's
    extra_repr)."""
    reprs: dict = {}
    report = _ranks(ns, partial(_build, ns, reprs), rank=ns.rank,
                    split_backward=ns.split_backward)
    return report, reprs


def analyze_split(ns: argparse.Namespace) -> Results:
    """The record of every rank of --pp, --ep or --cp, with the rank its view marks (a
    pipeline's: the pipeline rank of --rank)."""
    from ..parallel.pipeline.analysis import DEFAULT_DEVICE

    model, args, kwargs = built(ns)
    rank = ns.rank
    if ns.pp is not None:
        options = dict(device=ns.device_model or DEFAULT_DEVICE,
                       link_bytes_per_s=ns.render_options.link_bytes_per_s,
                       measure=ns.profile, warmup=ns.warmup, repeat=ns.repeat)
        rank = split_layout(ns).coordinates(ns.rank)["pp"]
    elif ns.ep is not None:  # the batch's count as the command counts a model (`analyzed`)
        options = dict(single_device=analyzed(ns, model, args, kwargs, strict=ns.strict,
                                              mode=ns.mode, fast=not ns.full_export))
    else:
        options = dict(load_balance=not ns.no_load_balance)
    return Results(record=_ranks(ns, model, args, kwargs, **options), rank=rank)


def _ranks(ns: argparse.Namespace, model, args=(), kwargs=None, **options):
    """`analyze_ranks` of MODEL on the flags' layout with their options, its errors (a model
    or an example the layout cannot split) naming the flags."""
    from ..parallel.entry import analyze_ranks

    with split_flagged(ns):
        return analyze_ranks(model, args, kwargs, mode=ns.mode, strict=ns.strict,
                             **split_options(ns), **options)


def _build(ns: argparse.Namespace, reprs: dict, device):
    """MODEL built on ``device`` (model, args, kwargs), its modules' extra_repr into
    ``reprs``."""
    from ..attribution import extra_reprs

    model, args, kwargs = built(ns, device)
    reprs.update(extra_reprs(model))
    return model, args, kwargs
