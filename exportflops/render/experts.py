"""The expert-parallel view (`ExpertParallelReport`): every rank side by side, then one rank's
all-to-alls and, inside FSDP2, its FSDP2 collectives. Pure: reads the record only; a time is
shown only when the caller names the link's bus bandwidth (`Collective.seconds`)."""

from __future__ import annotations

from ..records.experts import ExpertParallelReport, ExpertRank
from .collectives import kinds_table
from .format import Style
from .fsdp import fsdp_table

_RANK_HEADERS = ["rank", "experts", "routed tokens", "expert FLOPs", "expert MACs",
                 "other FLOPs", "total FLOPs", "vs one batch", "all-to-all bytes"]


def experts_view(record: ExpertParallelReport, *, rank: int = 0, style: Style = Style(),
                 link_bytes_per_s: float | None = None) -> str:
    """Each rank's routed token copies and work (its experts', the rest, the total over one
    batch on one device), its all-to-all bytes and inside FSDP2 its expert-parallel group and
    FSDP2 bytes, the busiest rank marked; then the all-to-alls of ``rank`` per MoE layer and
    phase and its FSDP2 collectives per unit (with ``link_bytes_per_s``, their times)."""
    routing = ("balanced routing" if record.balanced
               else f"routing {','.join(map(str, record.routing))}")
    title = (f"{record.model}: {record.num_experts} experts per layer over {record.ep} "
             f"expert-parallel ranks{_inside(record)}, {len(record.layers)} MoE layer"
             f"{'s' * (len(record.layers) != 1)}, top {record.top_k}, {record.tokens} tokens "
             f"{_routed_by(record)}, {routing} ({record.mode})")
    fsdp = record.fsdp is not None
    headers = [*_RANK_HEADERS[:1], *(["ep group"] if fsdp else []), *_RANK_HEADERS[1:],
               *(["FSDP2 bytes"] if fsdp else []), ""]
    rows = [_rank_row(r, record, style) for r in record.ranks]
    align = "l" + "l" * fsdp + "lrrrrrrr" + "r" * fsdp + "l"
    parts = [style.titled(title, style.table(rows, headers, align))]
    busiest = record.ranks[record.busiest_rank]
    if _even(record):
        share = (", its tensor-parallel share of one batch's work" if record.tp is not None
                 else ": one batch's work on one device")
        parts.append(f"Every rank computes {style.count(busiest.total.flops, 'FLOPs')}{share} "
                     f"(the all-to-alls move tokens, not FLOPs).")
    else:
        parts.append(f"Rank {busiest.rank} is the busiest: its "
                     f"{style.count(busiest.total.flops, 'FLOPs')} set the step.")
    if not record.complete:
        parts.append("Some ops are uncounted: these counts are lower bounds.")
    parts.append(_all_to_alls(record.ranks[rank], record, style, link_bytes_per_s))
    if fsdp:
        parts.append(_fsdp_collectives(rank, record, style, link_bytes_per_s))
    if record.tp is not None:
        parts.append(kinds_table(record.tp_collectives, f"Tensor-parallel collectives of rank "
                                 f"{rank}: the model's plan's and its MoE layers' (the routed "
                                 f"output summed, the routed inputs' gradients gathered), the "
                                 f"same sizes on every rank", style))
    return "\n\n".join(parts) + "\n"


def _routed_by(record: ExpertParallelReport) -> str:
    return "routed by each rank" if record.tp is not None else "per rank's batch"


def _inside(record: ExpertParallelReport) -> str:
    world = record.world_size()
    groups = f"{world // record.ep} expert-parallel groups of {record.ep} consecutive ranks"
    if record.tp is not None and record.fsdp is not None:
        return (f" inside {record.fsdp} FSDP2 x {record.tp} tensor-parallel ranks ({groups}; "
                f"each rank routing 1/{record.tp} of its batch's tokens)")
    if record.tp is not None:
        return (f", the {record.tp} tensor-parallel ranks (each routing 1/{record.tp} of a "
                f"batch's tokens)")
    if record.fsdp is None:
        return ""
    return f" inside {record.fsdp} FSDP2 ranks ({groups})"


def _rank_row(r: ExpertRank, record: ExpertParallelReport, style: Style) -> list:
    fsdp = record.fsdp is not None
    group = record.ep_group(r.rank)
    return [r.rank, *([f"{group[0]}-{group[-1]} (#{r.ep_rank})"] if fsdp else []),
            f"{r.first_expert}-{r.last_expert}", r.routed_tokens,
            style.count(r.expert.flops), style.count(r.expert.macs), style.count(r.rest.flops),
            style.count(r.total.flops), style.ratio(r.total.flops, record.single_device.flops),
            style.count(sum(c.bytes for c in r.all_to_alls), "B"),
            *([style.count(sum(c.bytes for c in record.fsdp_collectives), "B")] if fsdp else []),
            "busiest" if r.rank == record.busiest_rank and not _even(record) else ""]


def _even(record: ExpertParallelReport) -> bool:
    return len({r.total.flops for r in record.ranks}) == 1


def _all_to_alls(r: ExpertRank, record: ExpertParallelReport, style: Style,
                 link_bytes_per_s: float | None) -> str:
    timed = link_bytes_per_s is not None
    headers = ["MoE layer", "all-to-all", "phase", "dtype", "bytes", "bandwidth factor",
               *(["time"] if timed else [])]
    rows = [[c.module, c.node, c.phase, c.dtype, style.count(c.bytes, "B"),
             f"{c.bandwidth_factor:.3f}",
             *([style.seconds(c.seconds(link_bytes_per_s))] if timed else [])]
            for c in r.all_to_alls]
    for phase in ("forward", "backward"):
        listed = [c for c in r.all_to_alls if c.phase == phase]
        if listed:
            rows.append([f"total {phase}", "", "", "", style.count(sum(c.bytes for c in listed),
                                                                   "B"), "",
                         *([style.seconds(sum(c.seconds(link_bytes_per_s) for c in listed))]
                           if timed else [])])
    group = record.ep_group(r.rank)
    where = (f"rank {r.rank} of {record.ep}" if record.fsdp is None else
             f"rank {r.rank} (#{r.ep_rank} of expert-parallel group {group[0]}-{group[-1]})")
    title = (f"All-to-alls of {where} (bytes as nccl-tests sizes a message: the input; "
             f"{record.hidden} x {record.dtype} per token copy)")
    return style.titled(title, style.table(rows, headers, "llllrr" + "r" * timed))


def _fsdp_collectives(rank: int, record: ExpertParallelReport, style: Style,
                      link_bytes_per_s: float | None) -> str:
    dense, sparse = record.fsdp_group(rank), record.efsdp_group(rank)
    groups = {"fsdp": f"all {record.fsdp}" if record.tp is None else ",".join(map(str, dense)),
              "efsdp": ",".join(map(str, sparse))}
    over = (f"all {record.fsdp} ranks" if record.tp is None
            else f"the {record.fsdp} ranks of its tensor-parallel index, their tp shards")
    title = (f"FSDP2 collectives of rank {rank}, the same sizes on every rank (nccl-tests' "
             f"message: the gathered output, the reduce-scattered input): the blocks' other "
             f"parameters over {over} (fsdp), its experts over the {len(sparse)} ranks holding "
             f"them (efsdp)")
    return fsdp_table(record.fsdp_collectives, title, groups, style, link_bytes_per_s)
