"""The ``collectives`` view of a parallelized model's rank, and its lines in the summary.

Pure: reads ``report.world_size``, ``report.rank`` and ``report.collectives`` only. Bytes are
nccl-tests' message sizes (doc/PERFORMANCE.md in github.com/NVIDIA/nccl-tests) as the report
holds them; a time is the message times its bus-bandwidth factor over the link's bus bandwidth
(`Collective.seconds`), shown only when the caller names a bandwidth.
"""

from __future__ import annotations

from ..records import Collective, Report
from .format import Style

_HEADERS = ["op", "phase", "module", "mesh dim", "group size", "dtype", "bytes",
            "bandwidth factor"]


def collectives_view(report: Report, style: Style = Style(), *,
                     link_bytes_per_s: float | None = None) -> str:
    """One row per collective of this rank, in graph order, and a total per phase; with
    ``link_bytes_per_s`` (bus bandwidth of the link), each one's estimated time."""
    if not report.collectives:
        return style.titled("Collectives", f"none: rank {report.rank} of {report.world_size} "
                                           f"issues no collective")
    title = (f"Collectives of rank {report.rank} of {report.world_size} "
             f"({len(report.collectives)}; bytes as nccl-tests sizes a message)")
    timed = link_bytes_per_s is not None
    # A pipeline stage's sends and receives name the rank at the other end.
    peers = any(c.peer is not None for c in report.collectives)
    headers = [*_HEADERS, *(["peer"] if peers else []), *(["time"] if timed else [])]
    rows = []
    for c in report.collectives:
        row = [c.op, c.phase, c.module or "<root>", c.mesh_dim or "-", c.group_size, c.dtype,
               style.count(c.bytes, "B"), f"{c.bandwidth_factor:.3f}"]
        row += ["-" if c.peer is None else c.peer] if peers else []
        rows.append(row + ([style.seconds(c.seconds(link_bytes_per_s))] if timed else []))
    for phase in _phases(report):
        listed = [c for c in report.collectives if c.phase == phase]
        row = [f"total {phase}", "", "", "", "", "",
               style.count(sum(c.bytes for c in listed), "B"), "", *([""] if peers else [])]
        seconds = sum(c.seconds(link_bytes_per_s) for c in listed) if timed else None
        rows.append(row + ([style.seconds(seconds)] if timed else []))
    align = "llllrlrr" + ("r" if peers else "") + ("r" if timed else "")
    return style.titled(title, style.table(rows, headers, align))


def collective_summary_rows(report: Report, style: Style) -> list[list]:
    """The summary's lines for a parallelized model: which rank, and its collective bytes per
    phase. No lines for a single-device report."""
    if report.world_size == 1 and not report.collectives:
        return []
    rows = [["rank", f"{report.rank} of {report.world_size}",
             "every count above is this rank's, from its local shards"]]
    for phase in _phases(report):
        listed = [c for c in report.collectives if c.phase == phase]
        ops = ", ".join(sorted({c.op for c in listed}))
        rows.append([f"collective bytes, {phase}", style.count(sum(c.bytes for c in listed), "B"),
                     f"{len(listed)} collective{'s' * (len(listed) != 1)} ({ops}); nccl-tests "
                     f"message sizes"])
    return rows


def _phases(report: Report) -> list[str]:
    return [p for p in ("forward", "backward") if any(c.phase == p for c in report.collectives)]


def kinds_table(collectives: list[Collective], title: str, style: Style) -> str:
    """``collectives`` one row per phase, op and dtype: how many, and their bytes."""
    kinds: dict[tuple, list[int]] = {}
    for c in collectives:
        kinds.setdefault((c.phase, c.op, c.dtype), []).append(c.bytes)
    rows = [[phase, op, dtype, len(sizes), style.count(sum(sizes), "B")]
            for (phase, op, dtype), sizes in kinds.items()]
    return style.titled(title, style.table(rows, ["phase", "collective", "dtype", "count",
                                                  "bytes"], "lllrr"))
