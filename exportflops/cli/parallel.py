"""``--tp N`` and ``--fsdp N``: the model split by its own tensor-parallel plan, sharded with
FSDP2, or both on a 2-D mesh (`exportflops.parallel.parallelize`), under
`exportflops.fake_process_group`, and the report of one rank (``--rank``). FSDP2 refuses meta
parameters, so the model built on meta is copied onto fake tensors (``FakeTensorMode``, on
cpu): nothing is allocated either way.
"""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import LayoutError, UsageError
from .targets import build_target, hf_options


def analyze_parallelized(ns: argparse.Namespace):
    """(report of rank ``ns.rank``, each module's extra_repr) of MODEL at ``--tp ns.tp`` and
    ``--fsdp ns.fsdp`` (`exportflops.parallel.analyze_ranks`)."""
    from ..parallel.entry import analyze_ranks
    from .splits import split_flags, split_layout

    reprs: dict = {}
    try:
        report = analyze_ranks(partial(_build, ns, reprs), layout=split_layout(ns),
                               rank=ns.rank, mode=ns.mode, strict=ns.strict,
                               split_backward=ns.split_backward)
    except LayoutError as error:  # a layout that splits nothing, a model without a plan
        raise UsageError(f"{split_flags(ns)}: {error}") from error
    return report, reprs


def _build(ns: argparse.Namespace, reprs: dict, device):
    """MODEL built on ``device`` (model, args, kwargs), its modules' extra_repr into
    ``reprs``."""
    from ..attribution import extra_reprs

    model, args, kwargs = build_target(ns.model, device, shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    reprs.update(extra_reprs(model))
    return model, args, kwargs
