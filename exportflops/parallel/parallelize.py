"""Parallelizing a model on a `Layout`'s mesh, as torchtitan's ``parallelize_*`` functions do:
its own tensor-parallel plan on the ``tp`` dimension, then FSDP2 on the ``fsdp`` one.

Where the plan comes from: a built-in example's (`exportflops.examples.parallel.PARALLELIZE`,
by the model's class); a Hugging Face model's own ``tp_plan`` (``config.base_model_tp_plan``
expanded per layer, as ``from_pretrained(tp_plan="auto")`` applies it); any other model's
``tp_plan`` attribute, a dict {module path: ParallelStyle} as ``parallelize_module`` takes it
(``*`` matches one path part).

What FSDP2 shards: the usual recipe (torchtitan's ``apply_fsdp``; transformers' FSDP wrapping by
``_no_split_modules``): ``fully_shard`` on each block (`blocks_of`), then on the root. FSDP2
refuses meta parameters: shard a copy on fake tensors (`exportflops.count.ranks.fake_copy`).
With both, the mesh is (fsdp, tp), tensor parallel inner, as torchtitan lays it out: the plan
is applied on ``mesh["tp"]``, then FSDP2 on ``mesh["fsdp"]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import BuildError, LayoutError
from .fsdp_blocks import blocks_of
from .shard_sizes import check_shard_sizes


def parallelize(model: torch.nn.Module, mesh, *, experts: str | None = None,
                shard: Callable[[torch.nn.Module, object], None] | None = None,
                checkpoint: Callable[[torch.nn.Module], object] | None = None) -> None:
    """``model`` split in place on ``mesh`` (a `Layout`'s, dimensions ``fsdp`` and/or ``tp``):
    `tensor_parallel` on ``mesh["tp"]``, then ``checkpoint(model)`` where given (a fit plan's
    ``apply``), then FSDP2 on ``mesh["fsdp"]`` by ``shard(model, fsdp mesh)`` (default
    `fully_shard_blocks`). ``experts``: as `tensor_parallel` takes it. The order is
    torchtitan's (``parallelize_llama`` in torchtitan/models/llama3/infra/parallelize.py:
    ``apply_tp``, then ``apply_ac``, then ``apply_fsdp``): the tensor-parallel plan's module
    paths (``blocks.*.up``) do not see through a checkpoint wrapper, and FSDP2
    then shards the wrapped blocks."""
    dims = mesh.mesh_dim_names or ()
    if "tp" in dims:
        tensor_parallel(model, mesh["tp"], experts=experts)
    if checkpoint is not None:
        checkpoint(model)
    if "fsdp" in dims:
        (shard or fully_shard_blocks)(model, mesh["fsdp"])


def tensor_parallel(model: torch.nn.Module, mesh, *, experts: str | None = None) -> None:
    """``model`` split on the 1-D ``mesh`` by its own tensor-parallel plan (module docstring);
    with ``experts``, without the plan's entries for the modules of that name, each MoE layer
    routing the rank's share of its tokens (`exportflops.parallel.token_shares`)."""
    _apply_plan(model, mesh, skip=experts)
    if experts is not None:
        from .token_shares import route_token_shares
        route_token_shares(model, mesh, experts=experts)


def fully_shard_blocks(model: torch.nn.Module, mesh,
                       reshard_after_forward: bool | None = None) -> None:
    """FSDP2 on each block of ``model`` (`blocks_of`), then the root, over ``mesh``;
    ``reshard_after_forward`` as ``fully_shard`` takes it (None: FSDP2's default, True but for
    the root)."""
    from torch.distributed.fsdp import fully_shard

    try:
        for block in blocks_of(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    except Exception as error:  # FSDP2 refuses the model as built; torch raises many types
        raise BuildError(f"fully_shard on {type(model).__name__}'s blocks, then on the root, "
                         f"over {mesh.size()} ranks failed: {type(error).__name__}: "
                         f"{error}") from error


def _apply_plan(model: torch.nn.Module, mesh, skip: str | None = None) -> None:
    """The model's own tensor-parallel plan applied on ``mesh``, without its entries for the
    modules named ``skip`` and what they hold (a built-in example's plan holds none); a split
    of part of a head, or an uneven one, refused (`check_shard_sizes`)."""
    from ..examples.parallel import PARALLELIZE

    builtin = PARALLELIZE.get(type(model))
    plan = getattr(model, "tp_plan", None)
    if builtin is None and not (plan and (isinstance(plan, dict) or _is_hf(model))):
        raise LayoutError(
            f"{type(model).__name__} has no tensor-parallel plan to split it {mesh.size()} "
            f"ways. Built-in examples with one: "
            f"{', '.join(sorted(cls.__name__ for cls in PARALLELIZE))}; a Hugging Face model "
            f"needs a config with base_model_tp_plan; any other model gives its plan as a "
            f"tp_plan attribute, {{module path: ParallelStyle}} as "
            f"torch.distributed.tensor.parallel.parallelize_module takes it.")
    try:
        if builtin is not None:
            builtin(model, mesh)
        elif _is_hf(model):
            _hf_tensor_parallel(model, mesh, plan, skip)
        else:
            from torch.distributed.tensor.parallel import parallelize_module
            parallelize_module(model, mesh, {path: style for path, style in plan.items()
                                             if not _under(path, skip)})
    except LayoutError:  # a degree a built-in plan refuses by name
        raise
    except Exception as error:  # the plan does not fit the model at this degree
        raise BuildError(f"splitting {type(model).__name__} {mesh.size()} ways by its "
                         f"tensor-parallel plan failed: {type(error).__name__}: "
                         f"{error}") from error
    check_shard_sizes(model, mesh.size())


def _is_hf(model: torch.nn.Module) -> bool:
    """A transformers model, whose ``tp_plan`` is expanded per layer before it applies."""
    return hasattr(model, "_expand_parallel_plan")


def _under(path: str, name: str | None) -> bool:
    """Whether ``path`` is a module named ``name`` or inside one."""
    return name is not None and name in path.split(".")


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Each later name of a parameter held under several (a head tied to the embedding) -> its
    first name, the one ``named_parameters()`` gives."""
    first = {id(p): name for name, p in reversed(list(model.named_parameters(
        remove_duplicate=False)))}
    return {name: first[id(p)] for name, p in model.named_parameters(remove_duplicate=False)
            if first[id(p)] != name}


def _hf_tensor_parallel(model: torch.nn.Module, mesh, plan: dict,
                        skip: str | None = None) -> None:
    """transformers' plan applied as ``from_pretrained(tp_plan="auto")`` applies it, tied weights
    kept tied: ``apply_tensor_parallelism`` looks each planned parameter up by its first name
    only (``named_parameters()``), so a tied one (a head tied to the embedding) is sharded
    once, at that name, by its style, and its other names are pointed at the sharded
    parameter. The embedding's vocabulary-parallel rows and the head's column-parallel
    outputs shard the tied weight on the same dimension, the vocabulary. The plan's entries for
    modules named ``skip``, and inside them, are left out."""
    from transformers.integrations.tensor_parallel import apply_tensor_parallelism

    later = tied_names(model)
    expanded = {name: style for name, style in model._expand_parallel_plan(plan).items()
                if name not in later and not _under(name, skip)}
    apply_tensor_parallelism(model, mesh, expanded)
    for name, counted in later.items():
        owner, _, leaf = name.rpartition(".")
        source, _, source_leaf = counted.rpartition(".")
        setattr(model.get_submodule(owner), leaf,
                getattr(model.get_submodule(source), source_leaf))
