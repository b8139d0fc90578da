"""The memory of one step of a context-parallel rank (``memory_ranks`` with ``Layout(cp=C)``,
inside FSDP2 and over tensor parallelism: ``Layout(fsdp=F, cp=C, tp=T)``).

Context parallelism alone shards no parameter: a ring rank holds every parameter, or with
``tp`` its tensor-parallel rank's shards, and with ``fsdp`` FSDP2's shards of those over the
fsdp x cp ranks, as `analyze_ranks` splits the rank (`split_group`); their gradients and
optimizer states. It runs its own ``seq / cp`` positions of each row: the step of
`exportflops.memory` runs on the example's inputs cut to that shard, on a fake copy of the
model split on the rank's group under a fake process group (`split_step`), so the activations
and temporaries are the shard's as the model's own code makes them, at the rank's own heads.
What that step lacks is the ring: torch's ring attention (``_templated_ring_attention`` and
its backward in torch/distributed/tensor/experimental/_context_parallel/_attention.py, with the
default ``rotate_method`` all-gather) holds, while one attention call runs,

1. forward: ``torch.cat`` of the call's key and value (one K/V block, the rank's own) and its
   all-gather over the ring (``cp`` blocks): ``cp + 1`` blocks;
2. backward: the same ``cp + 1`` blocks gathered again, and the key and value gradients sent
   around the ring (``dkv_rotater``, all-to-all): their ``torch.cat`` and the block received,
   two blocks at the accumulation dtype (float32: ``convert_to_f32`` defaults to True).

Those are added as temporaries living over each attention op of the shard's step, at the
sizes of that op's key and value: with ``tp``, the rank's own heads. Not counted:
the float32 copies `_SDPAMerger` keeps of the partial outputs, and the float32 gradient
accumulators of the backward (docs/memory.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...capture.held import copied
from ...checkpointing import Blocks
from ...errors import InputError
from ...footprint.step import Storage, StepRun
from ...records.memory import MemoryReport
from ..layout import Layout

if TYPE_CHECKING:
    from ...records.fit import FitPlan

#: Bytes of the accumulation dtype of ring attention's backward (float32).
_ACCUMULATED = 4


def context_rank_memory(model: torch.nn.Module, args: tuple, kwargs: dict | None, *,
                        layout: Layout, rank: int, mode: str, optimizer: str, allocator: str,
                        optimizer_options: dict | None, loss,
                        checkpoint: Blocks | FitPlan | None = None) -> MemoryReport:
    """Global rank ``rank`` of ``layout`` (rings of ``cp``, with ``fsdp`` and ``tp``): the step
    on its sequence shard, of the model split on its `split_group` (the tensor-parallel plan,
    FSDP2 over the fsdp x cp ranks), with the ring's K/V blocks at its own heads (module
    docstring), ``checkpoint``'s blocks (`Blocks` or a `FitPlan`) wrapped. A recomputed
    attention call runs the ring again, and holds its blocks again."""
    from ...footprint import ALLOCATORS
    from ...footprint.report import memory_report
    from ..rank_step import split_step
    from .ranks import split_group

    name = type(model).__name__
    args, kwargs = sequence_shard(name, args, dict(kwargs or {}), layout.cp)
    group, group_rank = split_group(layout, rank)
    train = mode == "train"
    run = split_step(model, args, kwargs, group, group_rank, train=train, optimizer=optimizer,
                     optimizer_options=optimizer_options, loss=loss, checkpoint=checkpoint)
    with_ring_buffers(run, layout.cp, name)
    return memory_report(run, model, mode=mode, optimizer=optimizer if train else "",
                         allocator=allocator, size=ALLOCATORS[allocator],
                         world_size=layout.world_size, rank=rank)


def sequence_shard(name: str, args: tuple, kwargs: dict, cp: int) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with every tensor of the token ids' (batch, seq) leading shape
    cut to ``seq / cp`` positions (the rank's two load-balanced chunks, or its one, have that
    many; their values do not change a storage's size)."""
    from ...torch_internals import pytree

    leaves = pytree.tree_leaves((args, kwargs))
    ids = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim() == 2
                and not t.dtype.is_floating_point), None)
    if ids is None:
        raise InputError(f"{name}: context parallelism splits the sequence, and its example has "
                         f"no 2-D integer tensor of token ids (batch, seq) to split: pass "
                         f"input_ids.")
    rows, seq = ids.shape
    if seq % cp:
        raise InputError(f"{name}: a sequence of {seq} does not split over cp={cp} ranks: "
                         f"pass a sequence length that is a multiple of cp (2 x cp with load "
                         f"balancing).")

    def shard(tensor: torch.Tensor) -> torch.Tensor:
        return tensor[:, :seq // cp] if tuple(tensor.shape[:2]) == (rows, seq) else tensor

    # A tensor given twice (input_ids again as labels) is one shard, one storage, as on one
    # device (`capture.held.copied`).
    return copied((args, kwargs), shard)


def with_ring_buffers(run: StepRun, cp: int, name: str) -> None:
    """``run`` with the K/V blocks ring attention holds during each attention op, as
    temporaries living over that op (module docstring, steps 1 and 2)."""
    calls = [(index, op) for index, op in enumerate(run.ops)
             if "scaled_dot_product" in op.name]
    if not calls:
        raise InputError(f"{name} makes no scaled_dot_product_attention call: ring attention "
                         f"replaces those calls, so there is nothing to split the sequence of.")
    for index, op in calls:
        backward = "backward" in op.name
        # the forward's (query, key, value, ...); its backward's (grad_out, query, key, ...)
        key, value = op.arguments[2:4] if backward else op.arguments[1:3]
        held = (cp + 1) * (key[0] * key[1] + value[0] * value[1])
        if backward:
            held += 2 * (key[0] + value[0]) * _ACCUMULATED
        run.storages.append(Storage(held, "temporaries", index, op.module, index + 1))
