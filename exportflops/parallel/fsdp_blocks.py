"""The modules FSDP2 shards one by one before the root, by the usual recipe (torchtitan's
``apply_fsdp``; transformers' FSDP wrapping by ``_no_split_modules``): shared by ``--fsdp``
(`exportflops.parallel.parallelize`) and expert parallelism inside FSDP2
(`exportflops.parallel.experts.fsdp`)."""

from __future__ import annotations

import torch


def blocks_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of ``model``: the modules whose class a Hugging Face model names in
    ``_no_split_modules`` (its decoder layer), or else each entry of an outermost
    ``ModuleList`` (the built-in examples' ``layers`` and ``h``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        return [m for m in model.modules() if type(m).__name__ in names]
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    inner = {id(m) for outer in lists for m in outer.modules() if m is not outer}
    return [block for outer in lists if id(outer) not in inner for block in outer]
