"""The expert-parallel view (`ExpertParallelReport`): every rank side by side, then one rank's
all-to-alls. Pure: reads the record only; a time is shown only when the caller names the link's
bus bandwidth (`Collective.seconds`)."""

from __future__ import annotations

from ..records.experts import ExpertParallelReport, ExpertRank
from .format import Style

_RANK_HEADERS = ["rank", "experts", "routed tokens", "expert FLOPs", "expert MACs",
                 "other FLOPs", "total FLOPs", "vs one batch", "all-to-all bytes", ""]


def experts_view(record: ExpertParallelReport, *, rank: int = 0, style: Style = Style(),
                 link_bytes_per_s: float | None = None) -> str:
    """Each rank's routed token copies and work (its experts', the rest, the total over one
    batch on one device) and its all-to-all bytes, the busiest rank marked; then the
    all-to-alls of ``rank`` per MoE layer and phase (with ``link_bytes_per_s``, their times)."""
    routing = ("balanced routing" if record.balanced
               else f"routing {','.join(map(str, record.routing))}")
    title = (f"{record.model}: {record.num_experts} experts per layer over {record.ep} "
             f"expert-parallel ranks, {len(record.layers)} MoE layer"
             f"{'s' * (len(record.layers) != 1)}, top {record.top_k}, {record.tokens} tokens "
             f"per rank's batch, {routing} ({record.mode})")
    rows = [_rank_row(r, record, style) for r in record.ranks]
    parts = [style.titled(title, style.table(rows, _RANK_HEADERS, "lrrrrrrrrl"))]
    busiest = record.ranks[record.busiest_rank]
    if _even(record):
        parts.append(f"Every rank computes {style.count(busiest.total.flops, 'FLOPs')}: one "
                     f"batch's work on one device (the all-to-alls move tokens, not FLOPs).")
    else:
        parts.append(f"Rank {busiest.rank} is the busiest: its "
                     f"{style.count(busiest.total.flops, 'FLOPs')} set the step.")
    if not record.complete:
        parts.append("Some ops are uncounted: these counts are lower bounds.")
    parts.append(_all_to_alls(record.ranks[rank], record, style, link_bytes_per_s))
    return "\n\n".join(parts) + "\n"


def _rank_row(r: ExpertRank, record: ExpertParallelReport, style: Style) -> list:
    return [r.rank, f"{r.first_expert}-{r.last_expert}", r.routed_tokens,
            style.count(r.expert.flops), style.count(r.expert.macs), style.count(r.rest.flops),
            style.count(r.total.flops), style.ratio(r.total.flops, record.single_device.flops),
            style.count(sum(c.bytes for c in r.all_to_alls), "B"),
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
    title = (f"All-to-alls of rank {r.rank} of {record.ep} (bytes as nccl-tests sizes a "
             f"message: the input; {record.hidden} x {record.dtype} per token copy)")
    return style.titled(title, style.table(rows, headers, "llllrr" + "r" * timed))
