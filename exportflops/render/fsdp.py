"""FSDP2's collectives of one rank of a composed split (expert or context parallelism inside
FSDP2) as a table per unit, with per-phase totals: shared by `experts_view` and
`context_view`. Pure: reads the records only."""

from __future__ import annotations

from ..records.collectives import Collective
from .format import Style


def fsdp_table(collectives: list[Collective], title: str, groups: dict[str, str],
               style: Style, link_bytes_per_s: float | None = None) -> str:
    """One row per collective (its unit, op, phase, mesh dimension, the ranks of its group as
    ``groups`` names them per mesh dimension, dtype, bytes, bandwidth factor and, with
    ``link_bytes_per_s``, time), then each phase's total."""
    timed = link_bytes_per_s is not None
    headers = ["FSDP2 unit", "collective", "phase", "mesh dim", "group", "dtype", "bytes",
               "bandwidth factor", *(["time"] if timed else [])]

    def row(c: Collective) -> list:
        return [c.module or "(root)", c.op, c.phase, c.mesh_dim, groups.get(c.mesh_dim, ""),
                c.dtype, style.count(c.bytes, "B"), f"{c.bandwidth_factor:.3f}",
                *([style.seconds(c.seconds(link_bytes_per_s))] if timed else [])]

    rows = [row(c) for c in collectives]
    for phase in ("forward", "backward"):
        listed = [c for c in collectives if c.phase == phase]
        if listed:
            rows.append([f"total {phase}", "", "", "", "", "",
                         style.count(sum(c.bytes for c in listed), "B"), "",
                         *([style.seconds(sum(c.seconds(link_bytes_per_s) for c in listed))]
                           if timed else [])])
    return style.titled(title, style.table(rows, headers, "llllllrr" + "r" * timed))
