"""Parallel: one rank of a parallelized model, counted from its local shards, and every
collective it issues.

``ranks`` holds `fake_process_group` (one CPU process standing for a rank) and the per-rank
analysis; the captures themselves are ``capture.dtensor`` and ``capture.fsdp``.
"""

from .ranks import fake_process_group

__all__ = ["fake_process_group"]
