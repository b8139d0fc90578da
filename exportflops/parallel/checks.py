"""What the per-rank analyses can count on a `Layout`, checked before a model is built: the
splits that compose, the rank, the schedule and microbatches, the routing (`check_call`, which
`analyze_ranks` and `memory_ranks` run), and the sizes of what is split (`check_sizes`: a
pipeline's stages against the layers, a ring's chunks against the sequence), which the command
checks from a model's config alone.

Each error names the arguments as `analyze_ranks` takes them (``pp=2 schedule="1f1b"``,
``rank=``, ``microbatches=``), first in its message; the command writes them as its flags
(`exportflops.cli.targets.flags`). `Layout` itself checks the degrees.
"""

from __future__ import annotations

from ..errors import InputError, LayoutError
from .layout import DENSE, Layout
from .pipeline.schedules import SCHEDULES, pipeline_order, stages_per_rank

#: The schedule a pipeline runs when none is given.
DEFAULT_SCHEDULE = "1f1b"
#: The splits each family composes with (torchtitan composes more; these are counted here).
#: Expert parallelism composes with the rest: neither family takes it yet.
_COMPOSES = {"pp": ("fsdp", "tp"), "cp": ("fsdp", "tp")}
_FAMILY = {"pp": "a pipeline", "cp": "context parallelism"}


def check_call(layout: Layout, *, rank: int | None = None, schedule: str | None = None,
               microbatches: int | None = None, routing: list[int] | None = None,
               load_balance: bool = True) -> None:
    """``layout`` and the options of `analyze_ranks` on it: splits that compose, ``rank`` one
    of its ranks, ``schedule`` and ``microbatches`` a step torch lays out (with ``pp``),
    ``routing`` counts per expert (with ``ep``), ``load_balance=False`` with ``cp``."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"the per-rank analyses take layout=exportflops.parallel.Layout(...), "
                          f"got {type(layout).__name__}.")
    _check_composition(layout)
    if rank is not None:
        _check_rank(layout, rank)
    _check_pipeline(layout, schedule, microbatches)
    if routing is not None and layout.ep == 1:
        raise LayoutError("routing gives the token copies per expert of ep ranks: pass ep=N "
                          "too (Layout(dp=N, ep=N) alone).")
    if not load_balance and layout.cp == 1:
        raise LayoutError("load_balance=False splits the sequence of cp= ranks into contiguous "
                          "blocks: pass cp=N.")


def check_sizes(layout: Layout, *, model: str, schedule: str | None = None,
                layers: int | None = None, tokens: int | None = None, load_balance: bool = True,
                capped: bool = False) -> None:
    """``layout`` against the sizes of ``model``: with ``pp``, its ``layers`` hold the stages
    (whole layers each; ``capped``: layers= holds it to that depth, not its config); with
    ``cp``, its example's ``tokens`` split into equal chunks. None: not known yet."""
    if layout.pp > 1 and layers is not None:
        _check_stages(layout, schedule or DEFAULT_SCHEDULE, model, layers, capped)
    if layout.cp > 1 and tokens is not None:
        pieces = 2 * layout.cp if load_balance else layout.cp
        if tokens % pieces:
            chunks = ("2 x cp: torch's load balancing gives each rank a chunk from each end"
                      if load_balance else "cp chunks, load_balance=False")
            raise InputError(f"{arguments(layout)}: {model}'s example has {tokens} tokens, "
                             f"which do not split into {pieces} equal chunks ({chunks}); pass "
                             f"seq=N with N a multiple of {pieces}.")


def arguments(layout: Layout, **options: object) -> str:
    """``layout``'s degrees split more than once, then ``options`` not None, as arguments
    (``fsdp=2 cp=2 tp=2 rank=4``); dp left out where it is the ranks of ep alone."""
    alone = layout.dp == layout.ep and layout.fsdp == 1
    degrees = {name: getattr(layout, name) for name in (*DENSE, "ep")
               if getattr(layout, name) > 1 and not (name == "dp" and alone)}
    given = {**degrees, **{name: value for name, value in options.items() if value is not None}}
    return " ".join(f"{name}={value!r}" for name, value in given.items())


def _check_composition(layout: Layout) -> None:
    """The families compose with what `_COMPOSES` says; dp is where expert groups sit, and
    expert groups over tp without fsdp are the tp groups."""
    for family, composes in _COMPOSES.items():
        others = [name for name in (*DENSE, "ep") if name not in (family, *composes)
                  and getattr(layout, name) > 1]
        if getattr(layout, family) > 1 and others:
            raise LayoutError(f"{arguments(layout)}: {_FAMILY[family]} composes with "
                              f"{' and '.join(name + '=' for name in composes)}, not with "
                              f"{', '.join(name + '=' for name in others)} yet: analyze those "
                              f"alone.")
    if layout.dp > 1 and layout.ep == 1:
        raise LayoutError(f"{layout}: replicated data-parallel ranks each count as one device "
                          f"does (exportflops.analyze); dp here is where expert-parallel "
                          f"groups sit (Layout(dp=E, ep=E)).")
    if layout.ep > 1 and layout.tp > 1 and layout.fsdp == 1 and layout.tp != layout.ep:
        raise LayoutError(f"{arguments(layout)}: expert parallelism over tensor-parallel ranks "
                          f"without fsdp is laid out with ep= equal to tp= (more ranks holding "
                          f"the same experts are sharded by FSDP2): pass ep={layout.tp}, or "
                          f"add fsdp=F.")


def _check_rank(layout: Layout, rank: int) -> None:
    """``rank`` one of the layout's ranks, which there are more than one of when it is given."""
    if layout.world_size == 1 and rank != 0:
        raise LayoutError(f"rank={rank!r}: rank= picks a rank of pp=, fsdp=, cp=, tp= or ep= "
                          f"ranks: pass one of them too.")
    if isinstance(rank, bool) or not isinstance(rank, int) \
            or not 0 <= rank < layout.world_size:
        mesh = " x ".join(layout.degrees()) or "one"
        raise LayoutError(f"{arguments(layout, rank=rank)}: rank= one of "
                          f"0..{layout.world_size - 1} (the {mesh} ranks).")


def _check_pipeline(layout: Layout, schedule: str | None, microbatches: int | None) -> None:
    """``schedule`` and ``microbatches`` with ``pp``: a schedule of the table, and a step whose
    order torch lays out for the ranks, stages per rank and microbatches."""
    given = {name: value for name, value in (("schedule", schedule),
                                             ("microbatches", microbatches))
             if value is not None}
    if layout.pp == 1:
        if given:
            raise LayoutError(f"{layout}: {', '.join(given)} lay out a pipeline "
                              f"({arguments(layout, **given)}): pass them with pp=N.")
        return
    schedule = schedule or DEFAULT_SCHEDULE
    if schedule not in SCHEDULES:
        raise LayoutError(f"schedule={schedule!r}: the schedules are {', '.join(SCHEDULES)} "
                          f"(docs/pipeline.md).")
    if microbatches is not None and (isinstance(microbatches, bool) or microbatches < 1):
        raise LayoutError(f"microbatches={microbatches!r}: a step runs one microbatch or more.")
    try:
        pipeline_order(schedule, layout.pp, microbatches or layout.pp,
                       stages_per_rank(schedule))
    except InputError as error:
        raise LayoutError(f"pp={layout.pp} schedule={schedule!r}: {error}") from error


def _check_stages(layout: Layout, schedule: str, model: str, layers: int,
                  capped: bool) -> None:
    """A pipeline's stages, each of whole layers, no more than ``layers``."""
    per_rank = stages_per_rank(schedule)
    stages = layout.pp * per_rank
    if stages <= layers:
        return
    fixes = [f"pp={layers // per_rank} or less"] if layers >= per_rank else []
    if capped:
        fixes.append(f"layers={stages}")
    if per_rank > 1:
        fixes.append("a schedule with one stage per rank")
    looped = f" ({per_rank} on each of pp={layout.pp} ranks)" if per_rank > 1 else ""
    held = f" (layers={layers})" if capped else ""
    raise InputError(f"pp={layout.pp} schedule={schedule!r}: {model} has {layers} "
                     f"layers{held}, and a stage holds whole layers: {stages} stages{looped} "
                     f"need {stages} layers or more; pass {', or '.join(fixes)}.")
