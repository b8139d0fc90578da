"""Parallel: one rank of a parallelized model, counted from its local shards, and every
collective it issues.

``layout`` holds `Layout`, the degrees of every split and the one mesh built from them;
``parallelize`` splits a model on its mesh (tensor-parallel plan, FSDP2); ``entry`` holds
`analyze_ranks`, the entry point counting a layout's ranks (``per_rank``: one rank of tp and
fsdp; ``experts_layout``: expert parallelism on a layout); ``rank_memory`` holds
`memory_ranks`, a step's memory per rank of tp and fsdp;
``ranks`` holds `fake_process_group` (one CPU process standing for a rank) and the per-rank
analysis; the captures themselves are ``capture.dtensor`` and ``capture.fsdp``.
"""

from .layout import Layout
from .entry import analyze_ranks
from .rank_memory import memory_ranks
from ..count.ranks import fake_process_group

__all__ = ["Layout", "analyze_ranks", "fake_process_group", "memory_ranks"]
