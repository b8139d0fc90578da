"""Pipeline parallelism: ``analysis`` splits a model into stages as torch.distributed.pipelining
does and counts each with a counter per stage (`count_pipeline`), ``schedules`` holds torch's
schedule orders and the step's timeline, ``mesh`` a pipeline on the (pp, fsdp, tp) mesh (a
stage's rank standing for its group, the built-in Llama's stages), ``slices`` a whole model's
rank cut into the stages, and ``ranks`` the public `analyze_pipeline` (the stages given, or a
`Layout`: the pipeline composed with tp and fsdp, what `analyze_ranks` calls);
``stage_memory`` a pipeline rank's step memory (what `memory_ranks` calls with ``pp``),
``composed_memory`` the same with tp and fsdp on stages of the model's own modules (the
built-in Llama's, ``decoder_stage``'s for a transformers decoder).

The public names load on first use (PEP 562): ``parallel.checks`` reads the schedule table
below, and ``ranks`` runs those checks, so importing ``ranks`` with the package would close
the import cycle checks -> pipeline -> ranks -> checks.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module of this package that defines it.
_HOMES = {"analyze_pipeline": "ranks", "layer_split_points": "analysis"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
