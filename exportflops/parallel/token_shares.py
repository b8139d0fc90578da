"""Expert parallelism over the tensor-parallel ranks, as torchtitan lays it out when sequence
parallelism is off: the MoE layers route each tensor-parallel rank's share of the tokens.

The layout (torchtitan/models/common/MOE_SHARDING.md and moe_sharding.py, the row "EP on, SP
off"): the expert-parallel group is laid over the tensor-parallel ranks ("MoE reuses the mesh
axis named TP for sequence-token sharding", ``_tokens_per_expert_placement``). Each MoE layer
takes the hidden state replicated over the tp ranks, and on each rank:

- the router computes on the rank's ``1 / tp`` share of the tokens (its input redistributed
  from replicated to sharded on the tokens: a slice forward, an all-gather of its gradient
  backward), its weight replicated, so its gradient is a partial sum over the tp ranks: DTensor
  leaves it partial, and `router_gradient_reductions` lists the all-reduce that sums it;
- the routed experts take the same share (the same redistribution), run under expert
  parallelism, and their output, the rank's tokens in place and zeros elsewhere, is summed
  over the tp ranks (partial to replicated: an all-reduce forward, nothing backward).

The sharing and the summing run in two modules added beside the experts, ``token_share`` and
``token_sum``, so the report charges them (no FLOPs; their bytes and collectives) apart from the
experts' work, which expert parallelism scales with the routing.

Everything else runs by the model's own tensor-parallel plan (what ``--tp`` applies: a Hugging
Face model's ``base_model_tp_plan``), the plan's entries under the routed experts dropped: the
experts run whole on the rank's tokens, and `exportflops.parallel.experts` shares their work
out by the routing. A shared expert runs as the plan says (replicated when it names none).

In training each router's gradient is summed over the tp ranks
(`exportflops.parallel.experts.tp.router_gradient_reductions`). This module sits beside
`parallelize`, which applies it with the plan, below the family folders that read it.

The experts work per routed token copy at fixed sizes, as expert parallelism alone needs
(docs/expert-parallel.md); the router is the sibling of each experts module named ``gate`` or
``router`` (transformers' Mixtral, Qwen-MoE, OLMoE, DeepSeek; GPT-OSS).
"""

from __future__ import annotations

from functools import partial

import torch

from ..errors import InputError
from ..records.names import outermost_named, parent
from ..torch_internals import pytree

#: Names of the router beside each experts module: transformers' (``gate``, GPT-OSS's
#: ``router``).
ROUTERS = ("gate", "router")


def route_token_shares(model: torch.nn.Module, mesh, *, experts: str = "experts") -> None:
    """Each MoE layer of ``model`` (the parent of each outermost module named ``experts``)
    routes this rank's share of its tokens over the one-dimensional tensor-parallel ``mesh``
    (the module docstring's layout): its router's parameters replicated on ``mesh``, and two
    modules beside the experts, ``token_share`` and ``token_sum``, which forward hooks on the
    router and the experts call, so that the report charges the sharing and the summing to
    them, not to the experts' work. Call after the model's own plan is applied, on a model
    built for the analysis (the hooks and modules stay)."""
    from torch.distributed.tensor import distribute_module

    layers = moe_layers(model, experts)
    if not layers:
        raise InputError(f"{type(model).__name__} has no module named {experts!r}: expert "
                         f"parallelism over tensor-parallel ranks shares out each MoE layer's "
                         f"tokens; pass the experts modules' last path component.")
    for layer, path in layers:
        name = router_name(layer)
        if name is None:
            raise InputError(f"{type(model).__name__}'s MoE layer {path!r} has no router module "
                             f"named {' or '.join(ROUTERS)} beside its experts: the tokens "
                             f"each tensor-parallel rank routes cannot be shared out.")
        if hasattr(layer, "token_share"):
            raise InputError(f"{type(model).__name__}'s MoE layer {path!r} already has a "
                             f"token_share module: route_token_shares runs once per model.")
        router = getattr(layer, name)
        distribute_module(router, mesh)
        layer.token_share, layer.token_sum = TokenShare(mesh, path), TokenSum(mesh)
        router.register_forward_pre_hook(partial(_shared_input, layer.token_share, False),
                                         with_kwargs=True)
        router.register_forward_hook(_local_outputs)
        experts_module = layer.get_submodule(experts)
        experts_module.register_forward_pre_hook(partial(_shared_input, layer.token_share,
                                                         True), with_kwargs=True)
        experts_module.register_forward_hook(partial(_summed_output, layer.token_sum))


class TokenShare(torch.nn.Module):
    """This rank's share of an MoE layer's tokens: the hidden states flattened to (tokens,
    hidden), redistributed from replicated to sharded on the tokens (a slice forward, an
    all-gather of its gradient backward); a DTensor, or with ``local`` this rank's rows."""

    def __init__(self, mesh, path: str) -> None:
        super().__init__()
        self.mesh, self.path = mesh, path

    def forward(self, hidden: torch.Tensor, local: bool = False):
        from torch.distributed.tensor import DTensor, Replicate, Shard

        rows = hidden.reshape(-1, hidden.shape[-1])
        if rows.shape[0] % self.mesh.size():
            raise InputError(f"MoE layer {self.path!r} routes {rows.shape[0]} tokens, which "
                             f"{self.mesh.size()} tensor-parallel ranks cannot share equally: "
                             f"pass a batch x sequence that is a multiple of --tp.")
        shared = DTensor.from_local(rows, self.mesh, [Replicate()], run_check=False
                                    ).redistribute(self.mesh, [Shard(0)])
        return shared.to_local() if local else shared


class TokenSum(torch.nn.Module):
    """The experts' output for this rank's rows, in place among zeros for the others', summed
    over the ranks (partial to replicated: an all-reduce forward, nothing backward): every
    rank holds every token's output again."""

    def __init__(self, mesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        rows, width = output.shape[0], output.shape[-1]
        rank, size = self.mesh.get_local_rank(), self.mesh.size()
        placed = torch.cat([output.new_zeros(rows * rank, width), output.reshape(rows, width),
                            output.new_zeros(rows * (size - 1 - rank), width)])
        return DTensor.from_local(placed, self.mesh, [Partial()], run_check=False
                                  ).redistribute(self.mesh, [Replicate()]).to_local()


def router_name(layer: torch.nn.Module) -> str | None:
    """The name of the MoE layer's router: its child module named one of `ROUTERS`."""
    return next((name for name in ROUTERS
                 if isinstance(getattr(layer, name, None), torch.nn.Module)), None)


def moe_layers(model: torch.nn.Module, experts: str) -> list[tuple[torch.nn.Module, str]]:
    """(parent module, its path) of each outermost module named ``experts``."""
    return [(model.get_submodule(parent(path)), parent(path)) for path in
            outermost_named((path for path, _ in model.named_modules()), experts)]


def _shared_input(share: TokenShare, local: bool, module, args: tuple, kwargs: dict):
    """The module's hidden states (its first argument, or ``hidden_states``) as this rank's
    share: a DTensor for the router, whose replicated weight makes its gradient a partial sum,
    a local tensor for the experts."""
    name = None if args else "hidden_states"
    if name is not None and name not in kwargs:
        raise InputError(f"MoE layer {share.path!r}: {type(module).__name__} takes no "
                         f"positional argument and no hidden_states=: its tokens cannot be "
                         f"shared out.")
    shared = share(args[0] if name is None else kwargs[name], local)
    if name is None:
        return (shared, *args[1:]), kwargs
    return args, {**kwargs, name: shared}


def _local_outputs(module, args, output):
    from torch.distributed.tensor import DTensor

    return pytree.tree_map(lambda t: t.to_local() if isinstance(t, DTensor) else t, output)


def _summed_output(summed: TokenSum, module, args, output: torch.Tensor) -> torch.Tensor:
    return summed(output)
