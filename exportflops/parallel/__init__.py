"""Parallel: one rank of a parallelized model, counted from its local shards, and every
collective it issues.

``layout`` holds `Layout`, the degrees of every split and the one mesh built from them;
``ranks`` holds `fake_process_group` (one CPU process standing for a rank) and the per-rank
analysis; the captures themselves are ``capture.dtensor`` and ``capture.fsdp``.
"""

from .layout import Layout
from .ranks import fake_process_group

__all__ = ["Layout", "fake_process_group"]
