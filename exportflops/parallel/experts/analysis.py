"""Expert parallelism per rank, from the single-device count of one batch.

A mixture of experts' experts are sharded over ``ep`` ranks as torchtitan's ``ExpertParallel``
shards them (each expert weight split on dim 0: rank r holds experts r x E/ep .. (r+1) x E/ep
- 1), and every rank runs its own batch (expert parallelism inside data parallelism). In each
MoE layer a rank routes its tokens, sends each token copy to the rank holding its expert (the
dispatch all-to-all), runs its own experts on the copies it receives from every rank, and sends
the results back (the combine all-to-all); the backward runs both in reverse.

The single-device analysis gives everything: the work outside the experts is the same on every
rank (its own batch), and the experts' work of a batch is divided by the token copies it routed
(tokens x top_k per layer) to get the work per routed token, which each rank does for the copies
its experts receive. No process group is needed; docs/expert-parallel.md states the conventions.

Inside FSDP2 (``fsdp=F``, torchtitan's "ep inside fsdp"): the F data-parallel ranks form F / ep
expert-parallel groups of ep consecutive ranks, so rank r does the work of rank ``r mod ep`` of
its group (FSDP2 changes no FLOPs), and adds FSDP2's all-gathers and reduce-scatters, traced by
`exportflops.parallel.experts.fsdp`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import torch

from ...api import analyze
from ...errors import InputError
from ...records import Collective, Cost, Report
from ...records.experts import ExpertParallelReport, ExpertRank
from ...records.names import outermost_named
from .fsdp import expert_layout, fsdp_collectives

#: The op torchtitan's dispatch and combine issue (``all_to_all_single_autograd``).
_ALL_TO_ALL = "_c10d_functional.all_to_all_single.default"
#: Config attributes naming the experts per layer: Mixtral's, Qwen-MoE's, DeepSeek's.
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


def count_experts(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                    ep: int, fsdp: int | None = None, mode: str = "forward",
                    routing: list[int] | None = None, experts: str = "experts",
                    top_k: int | None = None, num_experts: int | None = None,
                    hidden: int | None = None, tokens: int | None = None,
                    **options: Any) -> ExpertParallelReport:
    """Each of ``ep`` expert-parallel ranks of ``model`` running a batch like ``args``: its
    expert work, the rest of its work, and its dispatch and combine all-to-alls per MoE layer.

    ``fsdp``: the experts' ranks sit inside ``fsdp`` FSDP2 ranks (a multiple of ``ep``), as
    torchtitan lays them out: every one of the ``fsdp`` ranks is reported, with FSDP2's
    collectives traced on a fake copy of ``model`` (`exportflops.parallel.experts.fsdp`).
    ``routing`` is the token copies per expert summed over every rank's batch of one
    expert-parallel group (a histogram of ``E`` counts summing to ``ep x tokens x top_k``), the
    same in each group; without it routing is balanced. Each MoE
    layer's experts are the modules whose last path component is ``experts`` (transformers'
    ``mlp.experts``, torchtitan's ``moe.experts``). ``top_k``, ``num_experts`` and ``hidden``
    default to the model's config (``num_experts_per_tok``, ``num_local_experts`` or
    ``num_experts``, ``hidden_size``), ``tokens`` to the tokens of the first input (its
    elements for token ids, all but its last dimension for hidden states). ``options`` go to
    `exportflops.analyze` (``strict``, ``fast``)."""
    report = analyze(model, args, kwargs, mode=mode, **options)
    sizes = moe_sizes(model, args, kwargs, experts=experts, top_k=top_k,
                      num_experts=num_experts, hidden=hidden, tokens=tokens)
    collectives = []
    if fsdp is not None:
        _check_sizes(report, ep, sizes["top_k"], sizes["num_experts"], sizes["tokens"])
        collectives = fsdp_collectives(model, args, kwargs, ep=ep, fsdp=fsdp,
                                       num_experts=sizes["num_experts"], experts=experts,
                                       mode=mode)
    return expert_parallel(report, ep=ep, fsdp=fsdp, fsdp_collectives=collectives,
                           routing=routing, experts=experts, **sizes)


def moe_sizes(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
              experts: str = "experts", top_k: int | None = None,
              num_experts: int | None = None, hidden: int | None = None,
              tokens: int | None = None) -> dict:
    """The sizes `expert_parallel` needs, given or read from ``model`` and its inputs:
    ``top_k``, ``num_experts``, ``hidden``, ``tokens`` and the routed tokens' ``dtype`` (the
    experts' parameters')."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if top_k is None:
        top_k = getattr(config, "num_experts_per_tok", None)
    if num_experts is None:
        num_experts = next((getattr(config, a) for a in _EXPERT_COUNTS
                            if isinstance(getattr(config, a, None), int)), None)
    if hidden is None:
        hidden = getattr(config, "hidden_size", None)
    if tokens is None:
        tokens = _tokens(args, kwargs or {})
    missing = [n for n, v in (("top_k", top_k), ("num_experts", num_experts),
                              ("hidden", hidden), ("tokens", tokens)) if v is None]
    if missing:
        raise InputError(f"{name}: cannot tell its {', '.join(missing)} (no config attribute "
                         f"num_experts_per_tok, num_local_experts/num_experts, hidden_size, or "
                         f"no tensor input): give the model a config with those attributes, or "
                         f"pass {', '.join(f'{m}=' for m in missing)} to analyze_experts.")
    params = [p for path, module in model.named_modules()
              if path.rpartition(".")[2] == experts for p in module.parameters()]
    if not params:
        raise InputError(f"{name} has no module named {experts!r} holding parameters: pass "
                         f"experts= the last path component of each MoE layer's experts module "
                         f"(transformers' Mixtral and Qwen-MoE: 'experts').")
    return {"top_k": top_k, "num_experts": num_experts, "hidden": hidden, "tokens": tokens,
            "dtype": params[0].dtype}


def _tokens(args: tuple, kwargs: dict) -> int | None:
    first = kwargs.get("input_ids", args[0] if args else kwargs.get("inputs_embeds"))
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        return None
    if first.dtype.is_floating_point:  # hidden states (..., hidden): one token per row
        return first.numel() // first.shape[-1]
    return first.numel()  # token ids


def expert_parallel(report: Report, *, ep: int, top_k: int, num_experts: int, hidden: int,
                    tokens: int, dtype: torch.dtype, routing: list[int] | None = None,
                    experts: str = "experts", fsdp: int | None = None,
                    fsdp_collectives: list[Collective] = (), tp: int | None = None,
                    single_device: Report | None = None) -> ExpertParallelReport:
    """`analyze_experts` on a report already counted: one batch of ``tokens`` tokens on one
    device, its MoE layers' experts the modules named ``experts``; with ``fsdp``, the FSDP2
    collectives of one rank (`exportflops.parallel.experts.fsdp.fsdp_collectives`), the same
    sizes on every rank. With ``tp`` (equal to ``ep``), ``report`` is one tensor-parallel rank's
    with its MoE layers routing its share of the tokens (`exportflops.parallel.experts.tp`),
    the same on every rank, and ``single_device`` the batch's single-device report."""
    _check_sizes(report, ep, top_k, num_experts, tokens)
    if tp is not None:
        tokens = _token_share(report.model, ep, tp, fsdp, tokens, single_device)
    layout = expert_layout(report.model, ep, fsdp, tp)
    layers = _expert_layers(report, experts)
    routed = tokens * top_k  # token copies one batch routes, per MoE layer
    histogram = _histogram(report.model, routing, ep, num_experts, routed)
    per_rank = num_experts // ep
    experts_cost = sum((report.module(path).inclusive for path in layers), Cost())
    rest = report.total - experts_cost
    token_bytes = hidden * dtype.itemsize
    group = []  # what each rank of one expert-parallel group does; each group does the same
    for ep_rank in range(ep):
        received = sum(histogram[ep_rank * per_rank:(ep_rank + 1) * per_rank])
        all_to_alls = _all_to_alls(layers, report.mode, ep, sent=routed * token_bytes,
                                   returned=received * token_bytes,
                                   dtype=str(dtype).removeprefix("torch."))
        group.append(dict(ep_rank=ep_rank, first_expert=ep_rank * per_rank,
                          last_expert=(ep_rank + 1) * per_rank - 1, routed_tokens=received,
                          expert=_share(experts_cost, received, routed), rest=rest,
                          all_to_alls=all_to_alls))
    # Inside FSDP2 (and over tp), ep innermost: rank r is rank r mod ep of its group
    # (ParallelDims' sparse mesh).
    ranks = [ExpertRank(rank=rank, **group[rank % ep]) for rank in range(layout.world_size)]
    busiest = max(ranks, key=lambda r: (r.total.flops, -r.rank)).rank
    whole = report if single_device is None else single_device
    return ExpertParallelReport(
        model=report.model, mode=report.mode, ep=ep, fsdp=fsdp, tp=tp,
        tp_collectives=list(report.collectives) if tp is not None else [],
        fsdp_collectives=list(fsdp_collectives), num_experts=num_experts, top_k=top_k,
        tokens=tokens, hidden=hidden, dtype=str(dtype).removeprefix("torch."), layers=layers,
        routing=histogram, balanced=routing is None, single_device=whole.total, ranks=ranks,
        busiest_rank=busiest, complete=not (report.uncounted or whole.uncounted))


def _token_share(model: str, ep: int, tp: int, fsdp: int | None, tokens: int,
                 single_device: Report | None) -> int:
    """The tokens each of ``tp`` ranks routes of a batch of ``tokens``, checked: without
    ``fsdp``, ``tp`` equal to ``ep``; the single-device report given."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"{model}: tp must be an int >= 1, got {tp!r}.")
    if fsdp is None and tp != ep:
        raise InputError(f"{model}: expert parallelism over {tp} tensor-parallel ranks without "
                         f"fsdp is laid out here with ep equal to tp (got ep {ep}): with "
                         f"{tp} // {ep} ranks holding the same experts torchtitan shards them "
                         f"over those ranks with FSDP2; pass ep = tp, or fsdp.")
    if single_device is None:
        raise InputError(f"{model}: with tp, pass single_device= the batch's single-device "
                         f"report; the report given is one tensor-parallel rank's.")
    if tokens % tp:
        raise InputError(f"{model}: a batch of {tokens} tokens does not split over {tp} "
                         f"tensor-parallel ranks: pass a batch x sequence that is a multiple "
                         f"of tp.")
    return tokens // tp


def _check_sizes(report: Report, ep: int, top_k: int, num_experts: int, tokens: int) -> None:
    for what, value in (("ep", ep), ("top_k", top_k), ("num_experts", num_experts),
                        ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{report.model}: {what} must be an int >= 1, got {value!r}.")
    if num_experts % ep:
        raise InputError(f"{report.model} has {num_experts} experts per layer, which {ep} ranks "
                         f"cannot hold equally: pass an ep that divides {num_experts}.")
    if top_k > num_experts:
        raise InputError(f"{report.model}: top_k {top_k} is more than its {num_experts} "
                         f"experts.")
    if report.symbols:
        raise InputError(f"{report.model}: its count depends on sizes that are not fixed "
                         f"({', '.join(s.name for s in report.symbols)}), a routing read from "
                         f"values or dynamic shapes: expert parallelism needs the experts' work "
                         f"per routed token at fixed sizes (a grouped-matmul MoE, transformers "
                         f"5's), without dynamic_shapes.")


def _expert_layers(report: Report, experts: str) -> list[str]:
    """The outermost modules named ``experts`` that ran: one per MoE layer, in the order the
    forward runs them (the module list is ordered by depth, then by name)."""
    found = outermost_named((m.path for m in report.modules if m.calls > 0), experts)
    if not found:
        raise InputError(f"{report.model} ran no module named {experts!r}: pass experts= the "
                         f"last path component of each MoE layer's experts module.")
    first_node = {}
    for index, node in enumerate(report.nodes):
        for path in found:
            if node.module == path or node.module.startswith(f"{path}."):
                first_node.setdefault(path, index)
    return sorted(found, key=lambda path: first_node.get(path, len(report.nodes)))


def _histogram(model: str, routing: list[int] | None, ep: int, num_experts: int,
               routed: int) -> list[int]:
    """Token copies per expert over every rank's batch: the given histogram, checked, or the
    balanced one (each rank's experts get ``routed`` copies, spread evenly over them)."""
    total = ep * routed
    if routing is None:
        per_rank = num_experts // ep
        return [routed // per_rank + (i % per_rank < routed % per_rank)
                for i in range(num_experts)]
    counts = list(routing)
    if (len(counts) != num_experts
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
            or sum(counts) != total):
        raise InputError(f"{model}: routing must give {num_experts} counts >= 0 (token copies "
                         f"per expert, over all {ep} ranks' batches) summing to {total} (ep "
                         f"{ep} x tokens x top_k {routed}); got {len(counts)} summing to "
                         f"{sum(c for c in counts if isinstance(c, int))}.")
    return counts


def _share(cost: Cost, part: int, whole: int) -> Cost:
    """``cost`` x part / whole, each field rounded to the nearest integer (exact when every op
    of the experts scales with the routed tokens, as a grouped matmul's does)."""
    return Cost(**{name: round(Fraction(getattr(cost, name) * part, whole))
                   for name in Cost.model_fields})


def _all_to_alls(layers: list[str], mode: str, ep: int, *, sent: int, returned: int,
                 dtype: str) -> list[Collective]:
    """Per MoE layer, the dispatch (this rank's token copies out: ``sent`` bytes) and the
    combine (the outputs of the copies its experts ran, back: ``returned`` bytes); in train
    mode the backward's, in reverse layer order: the combine's gradient (``sent``), then the
    dispatch's (``returned``). nccl-tests sizes an all-to-all by its input."""
    def one(layer: str, step: str, size: int, phase: str) -> Collective:
        return Collective(op="all_to_all", bytes=size, dtype=dtype, phase=phase,
                          group_size=ep, group="ep", mesh_dim="ep", module=layer, node=step,
                          torch_op=_ALL_TO_ALL, bandwidth_factor=float(Fraction(ep - 1, ep)))

    calls = [c for layer in layers for c in (one(layer, "token_dispatch", sent, "forward"),
                                             one(layer, "token_combine", returned, "forward"))]
    if mode == "train":
        calls += [c for layer in reversed(layers)
                  for c in (one(layer, "token_combine_backward", sent, "backward"),
                            one(layer, "token_dispatch_backward", returned, "backward"))]
    return calls
