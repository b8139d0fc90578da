"""The memory of one step of an expert-parallel rank (``memory_ranks`` with
``Layout(dp=E, ep=E)``), as `exportflops.parallel.experts.analysis` models the rank: its own
batch, each MoE layer's experts sharded over the ``ep`` ranks on dim 0 (torchtitan's
``ExpertParallel``), token copies dispatched to the rank holding their expert and combined back
by all-to-alls.

The step of `exportflops.memory` runs on a rank-shaped fake copy, under a fake process group of
``ep`` ranks: each experts module is replaced by `ExpertShard`, which holds the rank's
``E / ep`` experts (the module's parameters cut on dim 0; its other parameters, gradients and
optimizer states are the rank's only) and, in the forward,

1. copies each of the batch's tokens ``top_k`` times and sends them out (the dispatch's
   ``all_to_all_single_autograd``, torch/distributed/_functional_collectives.py), receiving the
   copies routed to its experts (``routing=``, balanced by default: `_histogram`);
2. runs its experts on those copies (the experts module's own forward, every copy sent to one
   local expert);
3. sends the outputs back (the combine's all-to-all) and sums each token's ``top_k`` outputs by
   its routing weights.

The backward runs the two all-to-alls in reverse as autograd makes them. Collectives move no
data under the fake process group; each allocates its output as on a real rank.
"""

from __future__ import annotations

import torch

from ...checkpointing import Blocks, wrap_plan
from ...errors import InputError
from ...records.memory import MemoryReport
from ...torch_internals import require
from .analysis import _histogram, moe_sizes


class ExpertShard(torch.nn.Module):
    """One rank's experts of an MoE layer with its dispatch and combine (module docstring);
    ``experts`` takes transformers 5's ``(hidden_states, top_k_index, top_k_weights)``."""

    def __init__(self, experts: torch.nn.Module, *, received: int, ep: int) -> None:
        super().__init__()
        self.experts = experts
        self.received = received
        self.ep = ep

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        all_to_all_single_autograd = require("all_to_all_single_autograd")
        tokens, top_k = top_k_index.shape
        copies = hidden_states.repeat_interleave(top_k, dim=0)  # (tokens x top_k, hidden)
        sent, received = _splits(tokens * top_k, self.ep), _splits(self.received, self.ep)
        group = torch.distributed.group.WORLD
        mine = all_to_all_single_autograd(copies, received, sent, group)  # (received, hidden)
        local = torch.zeros(self.received, 1, dtype=top_k_index.dtype)  # one local expert each
        out = self.experts(mine, local, torch.ones(self.received, 1, dtype=top_k_weights.dtype))
        back = all_to_all_single_autograd(out, sent, received, group)  # (tokens x top_k, hidden)
        weighted = back.view(tokens, top_k, -1) * top_k_weights.unsqueeze(-1)
        return weighted.sum(dim=1)


def expert_rank_memory(model: torch.nn.Module, args: tuple, kwargs: dict | None, *, ep: int,
                       rank: int, world_size: int, routing: list[int] | None, experts: str,
                       mode: str, optimizer: str, allocator: str,
                       optimizer_options: dict | None, loss,
                       checkpoint: Blocks | None = None) -> MemoryReport:
    """Rank ``rank`` of ``world_size`` (rank ``rank mod ep`` of its expert group): the step of
    its rank-shaped copy (module docstring), ``checkpoint``'s blocks (`Blocks` or a `FitPlan`)
    wrapped once its experts are sharded (torchtitan's order: expert parallelism, then
    activation checkpointing); a recomputed block runs its all-to-alls again."""
    from ...count.ranks import fake_copy, fake_process_group
    from ...footprint import ALLOCATORS, default_loss, run_fake
    from ...footprint.report import memory_report

    name = type(model).__name__
    sizes = moe_sizes(model, args, kwargs, experts=experts)
    num_experts, routed = sizes["num_experts"], sizes["tokens"] * sizes["top_k"]
    if num_experts % ep:
        raise InputError(f"{name} has {num_experts} experts per layer, which {ep} ranks cannot "
                         f"hold equally: pass an ep that divides {num_experts}.")
    histogram = _histogram(name, routing, ep, num_experts, routed)
    ep_rank, per_rank = rank % ep, num_experts // ep
    first = ep_rank * per_rank
    train = mode == "train"
    with fake_process_group(ep, rank=ep_rank):
        fake_model, fake_args, fake_kwargs = fake_copy(model, args, dict(kwargs or {}))
        _shard_experts(fake_model, experts, slice(first, first + per_rank),
                       received=sum(histogram[first:first + per_rank]), ep=ep)
        if checkpoint is not None:
            wrap_plan(fake_model, checkpoint, name=name)
        run = run_fake(fake_model, fake_args, fake_kwargs, name=name, train=train,
                       optimizer=optimizer, optimizer_options=optimizer_options,
                       loss=loss or default_loss(name))
    return memory_report(run, model, mode=mode, optimizer=optimizer if train else "",
                         allocator=allocator, size=ALLOCATORS[allocator],
                         world_size=world_size, rank=rank)


def _shard_experts(model: torch.nn.Module, experts: str, held: slice, *, received: int,
                   ep: int) -> None:
    """Each module of ``model`` (a fake copy) named ``experts`` replaced by its `ExpertShard`
    holding experts ``held``."""
    found = [(path, module) for path, module in model.named_modules()
             if path.rpartition(".")[2] == experts]
    for path, module in found:
        for param_name, param in list(module.named_parameters(recurse=False)):
            setattr(module, param_name, torch.nn.Parameter(param[held].clone(),
                                                           param.requires_grad))
        if isinstance(getattr(module, "num_experts", None), int):
            module.num_experts = held.stop - held.start
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent), leaf, ExpertShard(module, received=received,
                                                                ep=ep))


def _splits(total: int, ranks: int) -> list[int]:
    """``total`` rows over ``ranks`` peers as evenly as they go (only the sum sizes a buffer)."""
    return [total // ranks + (i < total % ranks) for i in range(ranks)]
