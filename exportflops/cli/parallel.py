"""``--tp N`` and ``--fsdp N``: the model split by its own tensor-parallel plan, sharded with
FSDP2, or both on a 2-D mesh, under `exportflops.fake_process_group`, and the report of one rank
(``--rank``).

Where the plan comes from: a built-in example's ``parallelize`` (`exportflops.examples.parallel`);
a Hugging Face model's own ``tp_plan`` (``config.base_model_tp_plan`` expanded per layer, as
``from_pretrained(tp_plan="auto")`` applies it); any other model's ``tp_plan`` attribute, a dict
{module path: ParallelStyle} as ``parallelize_module`` takes it (``*`` matches one path part).

What FSDP2 shards: the usual recipe (torchtitan's ``apply_fsdp``; transformers' FSDP wrapping by
``_no_split_modules``): ``fully_shard`` on each block, then on the root. A block is a module
whose class a Hugging Face model names in ``_no_split_modules`` (its decoder layer), or else each
entry of a ``ModuleList`` (the built-in examples' ``layers`` and ``h``). FSDP2 refuses meta
parameters, so the model built on meta is copied onto fake tensors (``FakeTensorMode``, on
cpu): nothing is allocated either way. With both degrees the mesh is (fsdp, tp), tensor
parallel inner, as torchtitan lays it out: the plan is applied on ``mesh["tp"]``, then FSDP2
on ``mesh["fsdp"]``.
"""

from __future__ import annotations

import argparse

from ..errors import BuildError, UsageError
from ..parallel.fsdp_blocks import blocks_of
from .targets import build_target, hf_options


def analyze_parallelized(ns: argparse.Namespace):
    """(report of rank ``ns.rank``, each module's extra_repr) of MODEL at ``--tp ns.tp`` and
    ``--fsdp ns.fsdp``."""
    _, report, reprs = parallelized(ns)
    return report, reprs


def parallelized(ns: argparse.Namespace, shard=None, inputs=None, fake: bool = False,
                 experts: str | None = None):
    """(the model as rank ``ns.rank`` holds it, that rank's report, each module's extra_repr)
    of MODEL at ``--tp ns.tp`` and ``--fsdp ns.fsdp``. ``shard(spec, model, mesh)`` applies
    FSDP2 (default: each block, then the root); ``inputs(args, kwargs)`` returns the inputs
    to count instead of the example's. Built on meta, then copied onto fake cpu tensors for
    FSDP2 (which refuses meta parameters) or when ``fake`` (on meta, attention is traced as
    its math decomposition; on cpu as one kernel call, as ring attention needs). ``experts``:
    the plan skips the modules of that name, and each MoE layer routes the rank's share of
    its tokens (`exportflops.parallel.experts_tp`, expert parallelism over the tp ranks)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from ..api import analyze
    from ..attribution import extra_reprs
    from ..parallel.ranks import fake_copy, fake_process_group

    degrees = {name: n for name, n in (("fsdp", ns.fsdp), ("tp", ns.tp)) if n is not None}
    world = (ns.tp or 1) * (ns.fsdp or 1)
    with fake_process_group(world, rank=ns.rank):
        mesh = init_device_mesh("cpu", tuple(degrees.values()), mesh_dim_names=tuple(degrees))
        model, args, kwargs = build_target(ns.model, torch.device("meta"), shapes=ns.shapes,
                                           kwargs=ns.kwargs, hf_options=hf_options(ns))
        if inputs is not None:
            args, kwargs = inputs(args, kwargs)
        if fake or ns.fsdp is not None:
            model, args, kwargs = fake_copy(model, args, kwargs or {})
        reprs = extra_reprs(model)
        if ns.tp is not None:
            tensor_parallel(ns.model, model, mesh["tp"], experts=experts)
        if ns.fsdp is not None:
            (shard or _fully_shard)(ns.model, model, mesh["fsdp"])
        report = analyze(model, args, kwargs, strict=ns.strict, mode=ns.mode,
                         split_backward=ns.split_backward)
    return model, report, reprs


def tensor_parallel(spec: str, model, mesh, experts: str | None = None) -> None:
    """``model`` split on ``mesh`` by its own tensor-parallel plan; with ``experts``, without the
    plan's entries for the modules of that name, each MoE layer routing the rank's share of its
    tokens (`exportflops.parallel.experts_tp`)."""
    _parallelize(spec, model, mesh, skip=experts)
    if experts is not None:
        from ..parallel.experts_tp import route_token_shares
        route_token_shares(model, mesh, experts=experts)


def _fully_shard(spec: str, model, mesh, reshard_after_forward: bool | None = None) -> None:
    """FSDP2 on each block, then the root; ``reshard_after_forward`` as fully_shard takes it
    (None: FSDP2's default, True but for the root)."""
    from torch.distributed.fsdp import fully_shard

    try:
        for block in blocks_of(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    except Exception as error:  # FSDP2 refuses the model as built
        raise BuildError(f"--fsdp {mesh.size()}: fully_shard on {spec}'s blocks, then on the "
                         f"root, failed: {type(error).__name__}: {error}") from error


def _parallelize(spec: str, model, mesh, skip: str | None = None) -> None:
    """The model's own tensor-parallel plan applied on ``mesh``, without its entries for the
    modules named ``skip`` and what they hold (a built-in example's plan holds none)."""
    from ..examples.parallel import PARALLELIZE

    plan = getattr(model, "tp_plan", None)
    try:
        if spec in PARALLELIZE:
            PARALLELIZE[spec](model, mesh)
        elif spec.startswith("hf:") and plan:
            _hf_tensor_parallel(model, mesh, plan, skip)
        elif isinstance(plan, dict) and plan:
            from torch.distributed.tensor.parallel import parallelize_module
            parallelize_module(model, mesh, {path: style for path, style in plan.items()
                                             if not _under(path, skip)})
        else:
            raise UsageError(
                f"--tp {mesh.size()}: {spec} has no tensor-parallel plan. Built-in examples "
                f"with one: {', '.join(sorted(PARALLELIZE))}; a Hugging Face model needs a "
                f"config with base_model_tp_plan; a factory's model gives its plan as a "
                f"tp_plan attribute, {{module path: ParallelStyle}} as "
                f"torch.distributed.tensor.parallel.parallelize_module takes it.")
    except UsageError:
        raise
    except Exception as error:  # the plan does not fit the model at this degree
        raise BuildError(f"splitting it {mesh.size()} ways by its tensor-parallel plan failed: "
                         f"{type(error).__name__}: {error}") from error


def _under(path: str, name: str | None) -> bool:
    """Whether ``path`` is a module named ``name`` or inside one."""
    return name is not None and name in path.split(".")


def tied_names(model) -> dict[str, str]:
    """Each later name of a parameter held under several (a head tied to the embedding) -> its
    first name, the one ``named_parameters()`` gives."""
    first = {id(p): name for name, p in reversed(list(model.named_parameters(
        remove_duplicate=False)))}
    return {name: first[id(p)] for name, p in model.named_parameters(remove_duplicate=False)
            if first[id(p)] != name}


def _hf_tensor_parallel(model, mesh, plan: dict, skip: str | None = None) -> None:
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

