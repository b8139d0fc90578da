"""A step's storages -> `MemoryReport`: the peak and what holds it, each kind's own maximum,
the module tree, the timeline."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .liveness import KINDS, live_by_kind
from .step import Storage, StepRun
from ..records.memory import KindBytes, MemoryPoint, MemoryReport, ModuleMemory


def memory_report(run: StepRun, model: torch.nn.Module, *, mode: str, optimizer: str,
                  allocator: str, size: Callable[[int], int], name: str | None = None,
                  world_size: int = 1, rank: int = 0) -> MemoryReport:
    """The report of ``run``, a step of ``model`` (the user's: its module paths and classes),
    named ``name`` (default: ``model``'s class), rank ``rank`` of ``world_size``."""
    live = live_by_kind(run, size)
    timeline = [MemoryPoint(index=i, op=op.name, module=op.module, phase=op.phase,
                            live=KindBytes(**bytes_by_kind))
                for i, (op, bytes_by_kind) in enumerate(zip(run.ops, live))]
    peak = max(timeline, key=lambda point: point.live.total)  # the first of equal peaks
    return MemoryReport(
        model=name or type(model).__name__, world_size=world_size, rank=rank, mode=mode,
        optimizer=optimizer, allocator=allocator,
        peak_bytes=peak.live.total, peak_phase=peak.phase,
        peak_node=f"{peak.op} #{peak.index}", peak_module=peak.module, by_kind=peak.live,
        max_by_kind=KindBytes(**{kind: max(point[kind] for point in live) for kind in KINDS}),
        modules=_modules(run, model, size), timeline=timeline)


def _modules(run: StepRun, model: torch.nn.Module,
             size: Callable[[int], int]) -> list[ModuleMemory]:
    own: dict[str, int] = {}
    for storage in run.storages:
        if storage.kind == "activations":
            own[storage.module] = own.get(storage.module, 0) + size(storage.nbytes)
    temporaries = [s for s in run.storages if s.kind == "temporaries"]
    modules = []
    for path, module in model.named_modules():
        inside = _inside(path)
        largest = max((s for s in temporaries if inside(s.module)),
                      key=lambda s: s.nbytes, default=None)
        modules.append(ModuleMemory(
            path=path, type=f"{type(module).__module__}.{type(module).__qualname__}",
            depth=path.count(".") + 1 if path else 0,
            activations=sum(nbytes for made_in, nbytes in own.items() if inside(made_in)),
            own_activations=own.get(path, 0),
            largest_temporary=size(largest.nbytes) if largest else 0,
            largest_temporary_op=_made_by(run, largest)))
    return modules


def _inside(path: str) -> Callable[[str], bool]:
    """Whether a module path is ``path`` or one of its descendants."""
    if not path:
        return lambda _: True
    return lambda other: other == path or other.startswith(path + ".")


def _made_by(run: StepRun, storage: Storage | None) -> str:
    if storage is None:
        return ""
    op = run.ops[storage.start]
    return f"{op.name} ({op.phase})"
