"""The sizes a tensor-parallel plan splits, checked once the plan is applied and before any
rank is captured, by the placements its styles gave each parameter (any plan: a built-in
example's, a Hugging Face ``tp_plan``, a model's own): each rank holds whole heads, and
equal shards.

Why a split of part of a head is refused rather than counted: torchtitan refuses a
tensor-parallel degree that does not divide ``n_heads`` or ``n_kv_heads``
(``Decoder.Config.update_from_config``, torchtitan/models/common/decoder.py; pytorch/torchtitan
issue 2574: GQA models "would crash deep in the forward pass"). transformers 5.24 neither
refuses it nor replicates key/value heads: its ``ColwiseParallel`` shards a projection's
output features as they fall (transformers/distributed/tensor_parallel.py), so a rank's
``k_proj`` output holds part of a head and the attention's ``view(*input_shape, -1,
head_dim)`` fails in the forward; its own ``get_kv_heads_per_rank`` answers None there (heads
that "cannot be evenly sharded"). A width the degree does not divide (a vocabulary of 65 over
2 ranks) transformers shards unevenly, the last rank holding a shorter slice; the capture of
a rank needs equal shards (`exportflops.capture.dtensor`), so it is refused here too, before
the run rather than on the ranks whose shard is shorter.
"""

from __future__ import annotations

import math
import re

import torch

from ..capture.dtensor import ShardedDim, sharded_dims
from ..errors import LayoutError

#: The degrees an error offers at most (the divisors of the sizes up to this one).
_OFFERED = 64


def check_shard_sizes(model: torch.nn.Module, tp: int) -> None:
    """Refuse ``model``, split ``tp`` ways by its plan, where a rank would hold part of a head
    or a shorter shard than another: `LayoutError` naming the model, each parameter (layers
    as ``*``), its dimension and size, and the degrees that divide them all."""
    heads, widths = _split_sizes(model)
    problems = {_layers_as_star(s.parameter): f"dimension {s.dim} ({s.size}) holds {count} "
                f"heads of head_dim {s.size // count}, and a rank holds whole heads"
                for s, count in heads if count % s.ranks}
    why = (" (torchtitan refuses a degree that does not divide the heads; transformers' "
           "attention cannot view part of a head)" if problems else "")
    problems.update({_layers_as_star(s.parameter): f"dimension {s.dim} ({s.size}) would "
                     f"split unevenly, and the capture of a rank needs equal shards"
                     for s in widths if s.size % s.ranks})
    if not problems:
        return
    divides = math.gcd(*(count for _, count in heads), *(s.size for s in widths))
    degrees = [f"tp={d}" for d in range(1, min(divides, _OFFERED) + 1) if divides % d == 0]
    offered = " or ".join(filter(None, (", ".join(degrees[:-1]), degrees[-1])))
    raise LayoutError(
        f"tp={tp}: {type(model).__name__}'s tensor-parallel plan splits "
        f"{'; '.join(f'{name}: {what}' for name, what in problems.items())}{why}. Pass a "
        f"degree that divides every size the plan splits: {offered}.")


def _split_sizes(model: torch.nn.Module) -> tuple[list[tuple[ShardedDim, int]],
                                                  list[ShardedDim]]:
    """(each split dimension of an attention module's parameter that is whole heads, with
    its head count; every other split dimension). An attention module is one with an int
    ``head_dim`` (transformers' attention classes set it); a dimension of ``k x head_dim``
    of a module under it is ``k`` heads (q/k/v's outputs, o's inputs)."""
    head_dims = {path: module.head_dim for path, module in model.named_modules()
                 if isinstance(getattr(module, "head_dim", None), int)}
    heads, widths = [], []
    for shard in sharded_dims(model):
        head_dim = _owner_head_dim(shard.parameter, head_dims)
        if head_dim and shard.size % head_dim == 0:
            heads.append((shard, shard.size // head_dim))
        else:
            widths.append(shard)
    return heads, widths


def _owner_head_dim(parameter: str, head_dims: dict[str, int]) -> int | None:
    """The ``head_dim`` of the innermost attention module above the module holding
    ``parameter`` (a projection's weight or bias); None outside attention, and for an
    attention module's own parameters (a vector per head, as gpt-oss's ``sinks``)."""
    path = parameter.rpartition(".")[0]
    while path:
        path = path.rpartition(".")[0]
        if path in head_dims:
            return head_dims[path]
    return None


def _layers_as_star(name: str) -> str:
    """``model.layers.3.self_attn.k_proj.weight`` as ``model.layers.*.self_attn.k_proj
    .weight``: one entry for every layer's copy."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", name)
