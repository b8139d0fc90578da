"""Parallel: one rank of a parallelized model, counted from its local shards, and every
collective it issues.

What goes where: at this level, what every family shares: ``layout`` (`Layout`, the degrees
of every split and the one mesh built from them), ``parallelize`` (a model's tensor-parallel
plan and FSDP2's units on the mesh), ``fsdp_blocks`` (the blocks FSDP2 shards one by one),
``fsdp_trace`` (FSDP2's collectives traced on a fake copy), ``per_rank`` (one rank of tp and
fsdp), ``entry`` (`analyze_ranks`, any layout from Python), ``rank_step`` (the step of one
rank of tp and fsdp on its fake copy) and ``rank_memory`` (`memory_ranks`, a step's memory per
rank of tp and fsdp, or of a pipeline). One folder per
family on top: ``pipeline/`` (stages, schedules, a pipeline on the mesh), ``experts/`` (expert
parallelism, inside FSDP2 and over tp) and ``context/`` (ring attention, with tp and inside
FSDP2).
`fake_process_group` (one CPU process standing for a rank) is ``count.ranks``'s, since every
count uses it; the captures themselves are ``capture.dtensor`` and ``capture.fsdp``.
"""

from .layout import Layout
from .entry import analyze_ranks
from .rank_memory import memory_ranks
from ..count.ranks import fake_process_group

__all__ = ["Layout", "analyze_ranks", "fake_process_group", "memory_ranks"]
