"""A context-parallel split (`ContextParallelReport`): every rank's work, then one rank's ring
traffic per phase and, inside FSDP2, its FSDP2 collectives. Pure: reads the record only."""

from __future__ import annotations

from ..records.context import ContextParallelReport, ContextRank
from .collectives import kinds_table
from .format import Style
from .fsdp import fsdp_table


def context_view(record: ContextParallelReport, *, style: Style = Style(),
                 rank: int = 0) -> str:
    """One row per rank (inside FSDP2 its ring; its positions, causal attention pairs, attention
    and other FLOPs, bytes sent, and inside FSDP2 its FSDP2 bytes), the busiest rank marked;
    then ``rank``'s ring messages grouped by phase and, inside FSDP2, its FSDP2 collectives."""
    split = ("round-robin in 2 x cp chunks (load balanced)" if record.load_balanced
             else "contiguous blocks (not load balanced)")
    apart = "consecutive ranks" if record.tp is None else f"ranks {record.tp} apart"
    inside = "" if record.fsdp is None else (
        f" inside {record.world_size()} FSDP2 ranks ({record.fsdp} rings of {record.cp} "
        f"{apart}, each its own batch)")
    if record.tp is not None:
        inside += (f", {record.tp} tensor-parallel ranks at each place of a ring "
                   f"({record.world_size()} ranks)")
    title = (f"{record.model}: context parallel over {record.cp} ranks{inside}, {split}; "
             f"{record.batch} x {record.seq_len} tokens per ring, {record.mode}")
    fsdp = record.fsdp is not None
    grouped = fsdp or record.tp is not None
    fsdp_bytes = [style.count(sum(c.bytes for c in record.fsdp_collectives), "B")] * fsdp
    busiest = record.busiest.rank
    equal = len({r.flops for r in record.ranks}) == 1
    marked = None if equal else busiest
    rows = [[f"{r.rank}{' *' if r.rank == marked else ''}", *([_ring(record, r)] * grouped),
             _positions(r), r.attention_pairs, style.count(r.attention_flops),
             style.count(r.other_flops), style.count(r.flops),
             style.ratio(r.flops, record.busiest.flops), style.count(r.send_bytes, "B"),
             *fsdp_bytes]
            for r in record.ranks]
    total = sum(r.flops for r in record.ranks)
    rows.append(["total", *([""] * grouped), "", sum(r.attention_pairs for r in record.ranks),
                 style.count(sum(r.attention_flops for r in record.ranks)),
                 style.count(sum(r.other_flops for r in record.ranks)), style.count(total), "",
                 style.count(sum(r.send_bytes for r in record.ranks), "B"),
                 *([style.count(len(record.ranks) * sum(c.bytes for c in
                                                        record.fsdp_collectives), "B")] * fsdp)])
    headers = ["rank", *(["cp group"] * grouped), "positions", "causal pairs", "attention FLOPs",
               "other FLOPs", "FLOPs", "of busiest", "sent", *(["FSDP2 bytes"] * fsdp)]
    notes = [f"* rank {busiest} does the most work and sets the step: "
             f"{record.imbalance:.3f} x the ranks' mean." if not equal else
             "Every rank does the same work.",
             f"Single device, without the work its causal mask discards: "
             f"{style.count(record.single_device_flops)} FLOPs." if record.single_device_causal
             else f"Single device: {style.count(record.single_device_flops)} FLOPs, every "
                  f"(query, key) pair counted (its attention takes a mask tensor, no causal "
                  f"flag).",
             f"Causal pairs are per row of the batch: {style.count(record.flops_per_pair)} "
             f"FLOPs each over {record.attention_layers} attention layers"
             f"{'' if record.tp is None else ', on one tensor-parallel rank'}."]
    align = "l" + "l" * grouped + "lrrrrrr" + "r" * fsdp
    parts = [style.titled(title, style.table(rows, headers, align)) + "\n"
             + "\n".join(notes),
             _traffic(record, record.ranks[rank], style)]
    if record.tp is not None:
        parts.append(_tensor_parallel(record, rank, style))
    if fsdp:
        parts.append(fsdp_table(
            record.fsdp_collectives,
            f"FSDP2 collectives of rank {rank}, the same sizes on every rank (nccl-tests' "
            f"message: the gathered output, the reduce-scattered input): every parameter over "
            f"{_fsdp_group(record)[0]} (fsdp: dp_shard x cp)",
            {"fsdp": _fsdp_group(record)[1]}, style))
    return "\n\n".join(parts) + "\n"


def _fsdp_group(record: ContextParallelReport) -> tuple[str, str]:
    """FSDP2's group, for a title and for a table's column: all ranks, or with tensor
    parallelism the fsdp x cp ranks of each tp index."""
    size = record.fsdp * record.cp
    if record.tp is None:
        return f"all {size} ranks", f"all {size}"
    return f"the {size} ranks sharing its tp index", f"{size} of its tp index"


def _ring(record: ContextParallelReport, rank: ContextRank) -> str:
    return f"{_members(record, rank.rank)} (#{rank.cp_rank})"


def _members(record: ContextParallelReport, rank: int) -> str:
    """The ranks of ``rank``'s ring: a range when consecutive, else listed."""
    group = record.cp_group(rank)
    return (f"{group[0]}-{group[-1]}" if (record.tp or 1) == 1
            else ", ".join(str(r) for r in group))


def _tensor_parallel(record: ContextParallelReport, rank: int, style: Style) -> str:
    """The tensor-parallel plan's collectives of ``rank``, one row per kind and phase."""
    first = rank - rank % record.tp
    return kinds_table(record.tp_collectives,
                       f"Tensor-parallel collectives of rank {rank} (its group {first}-"
                       f"{first + record.tp - 1}), on its share of the sequence, the same sizes "
                       f"on every rank", style)


def _positions(rank: ContextRank) -> str:
    return ", ".join(f"{c.start}-{c.stop - 1}" for c in rank.chunks)


def _traffic(record: ContextParallelReport, rank: ContextRank, style: Style) -> str:
    """The rank's messages, layers with the same message merged into one row."""
    layers: dict[tuple, int] = {}
    for s in rank.sends:
        key = (s.phase, s.tensors, s.sends, s.bytes, s.dtype)
        layers[key] = layers.get(key, 0) + 1
    rows = [[phase, tensors, count, sends, style.count(size, "B"), dtype,
             style.count(count * sends * size, "B")]
            for (phase, tensors, sends, size, dtype), count in layers.items()]
    for phase in ("forward", "backward"):
        listed = [s for s in rank.sends if s.phase == phase]
        if listed:
            rows.append([f"total {phase}", "", "", sum(s.sends for s in listed), "", "",
                         style.count(sum(s.total_bytes for s in listed), "B")])
    first = rank.sends[0] if rank.sends else None
    peers = f" (to rank {first.to_rank}, from rank {first.from_rank})" if first else ""
    where = (f"{rank.rank} of {record.cp}" if record.fsdp is None and record.tp is None else
             f"{rank.rank} (#{rank.cp_rank} of ring {_members(record, rank.rank)})")
    return style.titled(
        f"Ring traffic of rank {where}{peers}",
        style.table(rows, ["phase", "message", "layers", "sends per layer", "bytes per send",
                           "dtype", "bytes"], "llrrrlr"))
