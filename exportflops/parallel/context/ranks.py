"""Context parallelism on a `Layout`: rings of ``cp`` ranks alone, inside FSDP2 (``fsdp`` rings,
each running its own batch) and with ``tp`` ranks at each place of a ring, on torchtitan's mesh
(fsdp, cp, tp) (`exportflops.parallel.layout`).

The model is analyzed once, symbolic in the batch and sequence (`flops_per_batch`), and split
(`exportflops.parallel.context.context_split`), checked first; with ``tp`` each rank's work is
its tensor-parallel rank's read at four lengths (`exportflops.parallel.context.tp`), the rank
sharded by FSDP2 over the fsdp x cp ranks too when ``fsdp`` splits; with ``fsdp`` alone FSDP2's
collectives are traced on a fake copy (`exportflops.parallel.context.fsdp_collectives`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch

from ...aggregate import build_report
from ...errors import LayoutError
from ...records import Report
from ...records.context import ContextParallelReport
from ...training.per_batch import FlopsPerBatch, flops_per_batch
from .analysis import context_split, fsdp_collectives
from .tp import tensor_parallel_work
from ..layout import Layout
from ..per_rank import Builder, built_model, rank_of


def analyze_context_ranks(model: torch.nn.Module | Builder, args: Any = (),
                          kwargs: dict | None = None, *, layout: Layout,
                          mode: str = "forward", load_balance: bool = True, rank: int = 0,
                          **analyze_options: Any) -> tuple[ContextParallelReport, FlopsPerBatch]:
    """(the `ContextParallelReport` of every rank of ``layout``, the symbolic analysis its rank
    reports are read from by `context_rank_report`). ``model`` as `analyze_ranks` takes it;
    ``load_balance`` as `analyze_context` takes it; with ``tp``, the tensor-parallel rank
    counted is ``rank``'s (every rank's counts alike), ``analyze_options`` going to its
    `exportflops.analyze` (``strict``)."""
    if layout.pp > 1 or layout.ep > 1 or layout.dp > 1 or layout.cp == 1:
        raise LayoutError(f"{layout}: context parallelism takes cp > 1 with fsdp and tp, not "
                          f"with pp, dp or ep.")
    layout.check_rank(rank)
    built, args, kwargs = built_model(model, args, kwargs)
    fsdp, tp = (getattr(layout, name) if getattr(layout, name) > 1 else None
                for name in ("fsdp", "tp"))
    fpb = flops_per_batch(built, args, kwargs, mode=mode)
    record = context_split(fpb, args, kwargs, cp=layout.cp, load_balance=load_balance)
    if tp is not None:  # after the split's checks: each rank's count is the costly part
        rank_at = partial(_tensor_parallel_rank, model, args, kwargs, layout, rank, fpb, mode,
                          analyze_options)
        work, fsdp_on_rank, tp_on_rank = tensor_parallel_work(fpb, record, rank_at, tp=tp)
        record = context_split(fpb, args, kwargs, cp=layout.cp, load_balance=load_balance,
                               fsdp=fsdp, fsdp_collectives=fsdp_on_rank, tp=tp,
                               tp_collectives=tp_on_rank, work=work)
    elif fsdp is not None:
        record = context_split(fpb, args, kwargs, cp=layout.cp, load_balance=load_balance,
                               fsdp=fsdp, fsdp_collectives=fsdp_collectives(
                                   built, args, kwargs, cp=layout.cp, fsdp=fsdp, mode=mode))
    return record, fpb


def context_rank_report(record: ContextParallelReport, fpb: FlopsPerBatch,
                        rank: int) -> Report:
    """Rank ``rank``'s report: the single-device count at the example's sizes with the world
    and the collectives the rank issues (its share of the work is the record's)."""
    if not 0 <= rank < record.world_size():
        raise LayoutError(f"rank {rank}: the context-parallel layout of {record.model} has "
                          f"ranks 0..{record.world_size() - 1}.")
    return build_report(dataclasses.replace(
        fpb.counted, sizes={fpb.batch: record.batch, fpb.seq: record.seq_len},
        world_size=record.world_size(), rank=rank, collectives=record.collectives(rank)))


def split_group(layout: Layout, rank: int) -> tuple[Layout, int]:
    """(the layout of the ranks global ``rank`` splits the model with, its rank there): with
    ``fsdp``, the mesh (fsdp x cp, tp), FSDP2 sharding over the fsdp x cp ranks as torchtitan's
    does (``dp_shard_cp``), where the global rank is the rank (tp innermost on both); else its
    tp group alone (``Layout(tp=1)`` for a ring alone: one device's model)."""
    if layout.fsdp > 1:
        return Layout(fsdp=layout.fsdp * layout.cp, tp=layout.tp), rank
    return Layout(tp=layout.tp), rank % layout.tp


def _tensor_parallel_rank(model: torch.nn.Module | Builder, args: Any, kwargs: dict | None,
                          layout: Layout, rank: int, fpb: FlopsPerBatch, mode: str,
                          options: dict, length: int) -> Report:
    """``rank``'s tensor-parallel rank on ``length`` positions of each row, on its
    `split_group` (FSDP2 changes no FLOPs, and its trace is the quicker capture). On fake
    cpu tensors, where each attention call stays one kernel call, whose key and value the ring
    sends."""
    group, group_rank = split_group(layout, rank)
    return rank_of(model, args, kwargs, group, rank=group_rank, fake=True, mode=mode,
                   inputs=partial(fpb.resized, **{fpb.seq: length}), **options)[1]
