"""Expert parallelism over the tensor-parallel ranks in training: each rank's router saw its
own share of the tokens (`exportflops.parallel.token_shares`, applied with the model's plan by
`exportflops.parallel.parallelize`), so each router gradient is summed over the tp ranks."""

from __future__ import annotations

import torch

from ...records import Collective
from ..token_shares import moe_layers, router_name


def router_gradient_reductions(model: torch.nn.Module, tp: int, *,
                               experts: str = "experts") -> list[Collective]:
    """The backward's all-reduce of each router parameter's gradient over the ``tp`` ranks, MoE
    layers last to first: each rank's router saw its own share of the tokens, so its gradient
    is a partial sum (nccl-tests' all-reduce message: the tensor; bus factor 2 (tp - 1) / tp)."""
    reductions = []
    for layer, path in reversed(moe_layers(model, experts)):
        name = router_name(layer)
        for leaf, p in getattr(layer, name).named_parameters():
            if p.requires_grad:
                reductions.append(Collective(
                    op="all_reduce", bytes=p.numel() * p.element_size(),
                    dtype=str(p.dtype).removeprefix("torch."), phase="backward", group_size=tp,
                    group="tp", mesh_dim="tp", module=f"{path}.{name}".lstrip("."),
                    node=f"{leaf} gradient", torch_op="_c10d_functional.all_reduce.default",
                    bandwidth_factor=2 * (tp - 1) / tp))
    return reductions
