"""The memory of one step of an expert-parallel rank (``memory_ranks`` with ``ep``), as
`exportflops.parallel.experts` counts the rank: alone (``Layout(dp=E, ep=E)``: its own batch),
over the tensor-parallel ranks (``Layout(tp=T, ep=T)``, replicated ``dp`` times), inside FSDP2
(``Layout(fsdp=F, ep=E)``) or both (``Layout(fsdp=F, tp=T, ep=E)``). Each MoE layer's experts
are sharded over the ``ep`` ranks on dim 0 (torchtitan's ``ExpertParallel``), token copies
dispatched to the rank holding their expert and combined back by all-to-alls.

The step of `exportflops.memory` runs on a rank-shaped fake copy, under a fake process group of
the layout's ranks (`Layout.mesh`; the expert groups from its sparse mesh ``(efsdp, ep)``, ep
innermost), split in torchtitan's order (``parallelize_llama``: expert parallelism with the
tensor-parallel plan, activation checkpointing, then FSDP2):

- each experts module is replaced by `ExpertShard`, which holds the rank's ``E / ep`` experts
  (the module's parameters cut on dim 0) and, in the forward,

  1. copies each token it routes ``top_k`` times and sends them out (the dispatch's
     ``all_to_all_single_autograd``, torch/distributed/_functional_collectives.py) over its
     expert group, receiving the copies routed to its experts (``routing=``, balanced by
     default: `_histogram`), each peer's share as `_exchanged` deals them, so the same split
     runs on real ranks (`split_expert_rank`);
  2. runs its experts on those copies (the experts module's own forward, every copy sent to one
     local expert);
  3. sends the outputs back (the combine's all-to-all) and sums each token's ``top_k`` outputs
     by its routing weights;

  the backward runs the two all-to-alls in reverse as autograd makes them;
- with ``tp``, the model's own plan without its entries for the experts, each MoE layer
  routing the rank's ``1 / tp`` share of the tokens (`exportflops.parallel.token_shares`);
- with ``fsdp``, FSDP2 as `exportflops.parallel.experts.fsdp` lays it out: each `ExpertShard`
  over the ``efsdp = fsdp x tp / ep`` ranks holding the same experts (dim 1 where
  ``efsdp x ep`` outnumbers the experts), then the blocks and the root over ``fsdp``.

Collectives move no data under the fake process group; each allocates its output as on a real
rank. Replicated ranks (``dp`` beside ``tp``) run the same step; the gradient sums over the
ranks holding the same parameters (data parallelism's all-reduce) are not run, nor their buffers
counted.
"""

from __future__ import annotations

import functools
import warnings

import torch

from ...checkpointing import Blocks, wrap_plan
from ...errors import InputError
from ...records.memory import MemoryReport
from ...torch_internals import require
from ..layout import Layout
from ..parallelize import fully_shard_blocks, parallelize
from ..rank_step import unsharded_storages
from .analysis import _histogram, moe_sizes
from .fsdp import experts_dim, fully_shard_experts


class ExpertShard(torch.nn.Module):
    """One rank's experts of an MoE layer with its dispatch and combine (module docstring);
    ``experts`` takes transformers 5's ``(hidden_states, top_k_index, top_k_weights)``."""

    def __init__(self, experts: torch.nn.Module, *, copies: list[int], ep_rank: int,
                 group) -> None:
        super().__init__()
        self.experts = experts
        #: The token copies each rank of the expert group receives, from every rank's batch.
        self.copies = copies
        self.ep_rank = ep_rank
        self.received = copies[ep_rank]
        self.group = group

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        all_to_all = require("all_to_all_single_autograd")
        tokens, top_k = top_k_index.shape
        copies = hidden_states.repeat_interleave(top_k, dim=0)  # (tokens x top_k, hidden)
        ep = len(self.copies)
        sent = [_exchanged(self.copies, self.ep_rank, peer) for peer in range(ep)]
        received = [_exchanged(self.copies, peer, self.ep_rank) for peer in range(ep)]
        mine = all_to_all(copies, received, sent, self.group)  # (received, hidden)
        local = torch.zeros(self.received, 1, dtype=top_k_index.dtype)  # one local expert each
        out = self.experts(mine, local, torch.ones(self.received, 1, dtype=top_k_weights.dtype))
        back = all_to_all(out, sent, received, self.group)  # (tokens x top_k, hidden)
        weighted = back.view(tokens, top_k, -1) * top_k_weights.unsqueeze(-1)
        return weighted.sum(dim=1)


def expert_rank_memory(model: torch.nn.Module, args: tuple, kwargs: dict | None, *,
                       layout: Layout, rank: int, routing: list[int] | None, experts: str,
                       mode: str, optimizer: str, allocator: str,
                       optimizer_options: dict | None, loss,
                       checkpoint: Blocks | None = None) -> MemoryReport:
    """Rank ``rank`` of ``layout`` (rank ``coordinates(rank)["ep"]`` of its expert group): the
    step of its rank-shaped copy (module docstring, `split_expert_rank`) under a fake process
    group of the layout's ranks; a recomputed block runs its all-to-alls again."""
    from ...count.ranks import fake_copy, fake_process_group
    from ...footprint import ALLOCATORS, default_loss, run_fake
    from ...footprint.report import memory_report

    name = type(model).__name__
    train = mode == "train"
    with fake_process_group(layout.world_size, rank=rank):
        fake_model, fake_args, fake_kwargs = fake_copy(model, args, dict(kwargs or {}))
        split_expert_rank(fake_model, fake_args, fake_kwargs, layout=layout, rank=rank,
                          routing=routing, experts=experts, checkpoint=checkpoint)
        with warnings.catch_warnings():
            # FSDP2 warns of a unit returning a view (`TokenSum`'s output, a logits slice):
            # advice to the model's author that changes no byte of this step.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
            run = run_fake(fake_model, fake_args, fake_kwargs, name=name, train=train,
                           optimizer=optimizer, optimizer_options=optimizer_options,
                           loss=loss or default_loss(name),
                           resized=(lambda: unsharded_storages(fake_model))
                           if layout.fsdp > 1 else None)
    return memory_report(run, model, mode=mode, optimizer=optimizer if train else "",
                         allocator=allocator, size=ALLOCATORS[allocator],
                         world_size=layout.world_size, rank=rank)


def split_expert_rank(model: torch.nn.Module, args: tuple, kwargs: dict | None, *,
                      layout: Layout, rank: int, routing: list[int] | None = None,
                      experts: str = "experts", checkpoint: Blocks | None = None) -> None:
    """``model`` (run on a batch like ``args``, ``kwargs``) split in place as rank ``rank`` of
    ``layout`` runs its step, over the process group set up already (``layout.world_size``
    ranks: real ones, or `fake_process_group`'s), in torchtitan's order: its experts sharded
    (`ExpertShard`), then the tensor-parallel plan, ``checkpoint``'s blocks (`Blocks` or a
    `FitPlan`) and FSDP2 (`parallelize`). The same split on real ranks is what the memory
    analysis predicts (tests/footprint/rank_worker.py runs it on gloo)."""
    held, copies = _rank_experts(model, args, kwargs, layout, rank, routing, experts)
    dims = tuple(dim for dim in ("dp", "fsdp", "tp") if getattr(layout, dim) > 1)
    mesh, sparse = layout.device_mesh(*dims), layout.device_mesh("efsdp", "ep")
    _shard_experts(model, experts, held, copies=copies, ep_rank=layout.coordinates(rank)["ep"],
                   group=sparse["ep"].get_group())
    parallelize(model, mesh, experts=experts if layout.tp > 1 else None,
                shard=functools.partial(
                    _fully_shard, efsdp=sparse["efsdp"], experts=experts,
                    dim=experts_dim(sparse.size(), (held.stop - held.start) * layout.ep)),
                checkpoint=functools.partial(wrap_plan, plan=checkpoint,
                                             name=type(model).__name__)
                if checkpoint is not None else None)


def _rank_experts(model: torch.nn.Module, args: tuple, kwargs: dict | None, layout: Layout,
                  rank: int, routing: list[int] | None, experts: str,
                  ) -> tuple[slice, list[int]]:
    """(the experts rank ``rank`` holds, the token copies routed to each rank's experts of
    its expert group): each rank of an expert group routes its batch's tokens, with ``tp`` its
    tensor-parallel share of them (`exportflops.parallel.token_shares`), ``top_k`` copies
    each; ``routing`` counts the group's copies per expert (`_histogram`)."""
    name = type(model).__name__
    sizes = moe_sizes(model, args, kwargs, experts=experts)
    num_experts, ep, tp = sizes["num_experts"], layout.ep, layout.tp
    if num_experts % ep:
        raise InputError(f"{name} has {num_experts} experts per layer, which {ep} ranks cannot "
                         f"hold equally: pass an ep that divides {num_experts}.")
    if sizes["tokens"] % tp:
        raise InputError(f"{name}: a batch of {sizes['tokens']} tokens does not split over "
                         f"{tp} tensor-parallel ranks: pass a batch x sequence that is a "
                         f"multiple of tp.")
    histogram = _histogram(name, routing, ep, num_experts, sizes["tokens"] // tp * sizes["top_k"])
    per_rank = num_experts // ep
    first = layout.coordinates(rank)["ep"] * per_rank
    return slice(first, first + per_rank), [sum(histogram[r * per_rank:(r + 1) * per_rank])
                                            for r in range(ep)]


def _shard_experts(model: torch.nn.Module, experts: str, held: slice, *, copies: list[int],
                   ep_rank: int, group) -> None:
    """Each module of ``model`` named ``experts`` replaced by its `ExpertShard` holding experts
    ``held``, rank ``ep_rank`` of the expert group ``group`` whose ranks receive ``copies``."""
    found = [(path, module) for path, module in model.named_modules()
             if path.rpartition(".")[2] == experts]
    for path, module in found:
        for param_name, param in list(module.named_parameters(recurse=False)):
            setattr(module, param_name, torch.nn.Parameter(param[held].clone(),
                                                           param.requires_grad))
        if isinstance(getattr(module, "num_experts", None), int):
            module.num_experts = held.stop - held.start
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent), leaf,
                ExpertShard(module, copies=copies, ep_rank=ep_rank, group=group))


def _fully_shard(model: torch.nn.Module, fsdp, *, efsdp, experts: str, dim: int) -> None:
    """FSDP2 as torchtitan applies it with expert parallelism: each `ExpertShard` over the
    ``efsdp`` ranks holding the same experts (on ``dim``), then the blocks and the root over
    ``fsdp`` (`exportflops.parallel.experts.fsdp`)."""
    fully_shard_experts(model, efsdp, experts=experts, experts_dim=dim)
    fully_shard_blocks(model, fsdp)


def _exchanged(copies: list[int], sender: int, receiver: int) -> int:
    """The token copies ``sender`` sends ``receiver`` in an expert group whose ranks' experts
    receive ``copies``: the group's copies, numbered receiver by receiver, dealt out to the
    senders in turn (copy k from sender k mod ep). So every sender sends sum(copies) / ep, its
    own tokens x top_k (`_histogram` sums to ep of them), every receiver gets its count, and
    the splits of the ranks pair up as a real dispatch's do; only the sums size a buffer."""
    ep, start = len(copies), sum(copies[:receiver])

    def below(end: int) -> int:  # the copies numbered 0 .. end - 1 that ``sender`` deals
        return -(-(end - sender) // ep)
    return below(start + copies[receiver]) - below(start)
