"""Parallel: one rank of a parallelized model, counted from its local shards, and every
collective it issues.

``layout`` holds `Layout`, the degrees of every split and the one mesh built from them;
``parallelize`` splits a model on its mesh (tensor-parallel plan, FSDP2); ``per_rank`` holds
`analyze_ranks`, the entry point counting a rank of a layout;
``ranks`` holds `fake_process_group` (one CPU process standing for a rank) and the per-rank
analysis; the captures themselves are ``capture.dtensor`` and ``capture.fsdp``.
"""

from .layout import Layout
from .per_rank import analyze_ranks
from ..count.ranks import fake_process_group

__all__ = ["Layout", "analyze_ranks", "fake_process_group"]
