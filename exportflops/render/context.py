"""A context-parallel split (`ContextParallelReport`): every rank's work, then one rank's ring
traffic per phase. Pure: reads the record only."""

from __future__ import annotations

from ..records.context import ContextParallelReport, ContextRank
from .format import Style


def context_view(record: ContextParallelReport, *, style: Style = Style(),
                 rank: int = 0) -> str:
    """One row per rank (its positions, causal attention pairs, attention and other FLOPs,
    bytes sent), the busiest rank marked; then ``rank``'s ring messages grouped by phase."""
    split = ("round-robin in 2 x cp chunks (load balanced)" if record.load_balanced
             else "contiguous blocks (not load balanced)")
    title = (f"{record.model}: context parallel over {record.cp} ranks, {split}; "
             f"{record.batch} x {record.seq_len} tokens, {record.mode}")
    busiest = record.busiest.rank
    equal = len({r.flops for r in record.ranks}) == 1
    marked = None if equal else busiest
    rows = [[f"{r.rank}{' *' if r.rank == marked else ''}", _positions(r), r.attention_pairs,
             style.count(r.attention_flops), style.count(r.other_flops), style.count(r.flops),
             style.ratio(r.flops, record.busiest.flops), style.count(r.send_bytes, "B")]
            for r in record.ranks]
    total = sum(r.flops for r in record.ranks)
    rows.append(["total", "", sum(r.attention_pairs for r in record.ranks),
                 style.count(sum(r.attention_flops for r in record.ranks)),
                 style.count(sum(r.other_flops for r in record.ranks)), style.count(total), "",
                 style.count(sum(r.send_bytes for r in record.ranks), "B")])
    headers = ["rank", "positions", "causal pairs", "attention FLOPs", "other FLOPs", "FLOPs",
               "of busiest", "sent"]
    notes = [f"* rank {busiest} does the most work and sets the step: "
             f"{record.imbalance:.3f} x the ranks' mean." if not equal else
             "Every rank does the same work.",
             f"Single device, without the work its causal mask discards: "
             f"{style.count(record.single_device_flops)} FLOPs." if record.single_device_causal
             else f"Single device: {style.count(record.single_device_flops)} FLOPs, every "
                  f"(query, key) pair counted (its attention takes a mask tensor, no causal "
                  f"flag).",
             f"Causal pairs are per row of the batch: {style.count(record.flops_per_pair)} "
             f"FLOPs each over {record.attention_layers} attention layers."]
    parts = [style.titled(title, style.table(rows, headers, "lrrrrrrr")) + "\n"
             + "\n".join(notes),
             _traffic(record, record.ranks[rank], style)]
    return "\n\n".join(parts) + "\n"


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
    return style.titled(
        f"Ring traffic of rank {rank.rank} of {record.cp}{peers}",
        style.table(rows, ["phase", "message", "layers", "sends per layer", "bytes per send",
                           "dtype", "bytes"], "llrrrlr"))
