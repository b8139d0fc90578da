"""The fit planner: which blocks to checkpoint so that a training step fits a memory budget
(`fit`, the record `FitPlan`).

`exportflops.checkpointing` wraps blocks in activation checkpointing; ``budget`` reads a
budget; ``sizes`` finds the largest batch and length that fit from the step's memory at
symbolic sizes (or searches a size over steps at each). Every peak
is `exportflops.memory` of the model with the plan applied (on a parallel layout, the highest
rank's `exportflops.parallel.memory_ranks`), every recompute `exportflops.analyze`
(mode="train") of it.
Definitions: docs/fit.md.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from .budget import budget_bytes
from ..capture.export import without_cache
from .sizes import MOST_ROWS, Resize, example_sizes, largest_sizes
from ..checkpointing import Blocks, wrapped
from ..errors import DoesNotFitError, InputError, LayoutError
from ..records.fit import FitCandidate, FitPlan
from ..records.memory import MemoryReport, RanksMemory
from ..records.symbolic import largest_size
from ..records.symbolic_memory import SymbolicMemoryReport

if TYPE_CHECKING:
    from ..parallel.layout import Layout


def fit(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
        budget: int | str, mode: str = "train", optimizer: str = "adamw",
        device_model: str | None = None, resize: Resize | None = None,
        search_batch: bool = True, layout: Layout | None = None, **options: Any) -> FitPlan:
    """The checkpointing plan that adds the least recompute to a training step of ``model``
    on ``args``/``kwargs`` while its predicted peak stays at most ``budget``.

    ``budget``: bytes, a size (``"80GiB"``, ``"40GB"``) or a device key (its capacity less
    `budget.HEADROOM`). The candidates checkpoint the first k blocks (`block_paths`),
    k = 0..n, whole (reentrant) or selectively (non-reentrant, the matrix products' and
    attention's outputs kept: `exportflops.checkpointing.save_matmuls`), each measured: its
    peak by `exportflops.memory` (``optimizer`` and ``**options`` passed on), its recompute by
    `exportflops.analyze` (mode="train"), timed on ``device_model``'s roofs when given. The
    least recompute that fits wins (`cheapest`), so a larger budget never gives more. The
    largest batch and length that fit, with the plan and without, come from the step's memory
    at symbolic sizes (`sizes.largest_sizes`); a given ``resize(batch) -> (args, kwargs)``
    sizes the example instead, for a search of the batch over steps at each size
    (``search_batch=False`` skips both). With a ``layout`` (any `memory_ranks` takes:
    ``Layout(fsdp=F, tp=T)``, a pipeline ``Layout(pp=P)`` with its stages on fsdp and tp ranks
    or not, a ring ``Layout(cp=C)`` inside fsdp and over tp, expert parallelism alone, over tp
    or inside fsdp; its options such as ``schedule=`` in ``**options``), every peak is the
    highest rank's (`_every_rank`), the plan checkpoints the same blocks on every rank (on a
    pipeline, each in the stage holding it), and the largest batch and length are a rank's
    (a pipeline's: one microbatch's; a ring's: the sequence it splits, a multiple of C),
    searched over steps at each size (no symbolic memory per rank yet); the recompute stays
    the whole step's. Nothing fits: `DoesNotFitError`. The model is left as it was;
    ``plan.apply(model)`` wraps the chosen blocks.
    """
    name = type(model).__name__
    if mode != "train":
        raise InputError(f"mode={mode!r} for {name}: fit() plans activation checkpointing, "
                         f"which only a training step has (mode='train').")
    limit, given = budget_bytes(budget)
    if layout is not None and options.get("routing") is not None and search_batch:
        raise InputError(f"{layout}: routing= gives the token copies per expert of {name}'s "
                         f"example, which another batch or length does not have: pass "
                         f"search_batch=False to plan at the example, or no routing (balanced) "
                         f"to search the largest batch and length too.")
    # A cache in a training step is written again by each checkpointed block's recompute (and
    # breaks a selective one's replay): the step planned is the one without it, as
    # transformers' own gradient checkpointing turns it off.
    kwargs, _, _ = without_cache(model, args, dict(kwargs or {}))
    args, kwargs = tuple(args), dict(kwargs)
    paths = block_paths(model)
    if not paths:
        raise InputError(f"{name} has no blocks to checkpoint: fit() wraps the modules of an "
                         f"outermost ModuleList or a Hugging Face model's _no_split_modules.")

    def peak(shape: Shape, step_args: tuple, step_kwargs: dict,
             dynamic_shapes: Any = None) -> MemoryReport | SymbolicMemoryReport | RanksMemory:
        from ..footprint import memory

        if layout is not None:
            return _every_rank(model, step_args, step_kwargs, layout,
                               _wrapped_paths(paths, shape), optimizer=optimizer, **options)
        with wrapped(model, *_wrapped_paths(paths, shape)) as planned:
            return memory(planned, step_args, step_kwargs, optimizer=optimizer,
                          dynamic_shapes=dynamic_shapes, **options)

    shapes = [(count, False) for count in range(len(paths) + 1)]
    shapes += [(count, True) for count in range(1, len(paths) + 1)]
    steps = {(0, False): peak((0, False), args, kwargs)}
    for shape in shapes[1:]:
        try:
            steps[shape] = peak(shape, args, kwargs)
        except LayoutError:  # the layout cannot checkpoint the block: its own words
            raise
        except InputError as error:  # the output needs no gradient once the block is wrapped
            raise _loses_gradients(name, paths[shape[0] - 1]) from error
        if _gradients(steps[shape]) != _gradients(steps[0, False]):
            raise _loses_gradients(name, paths[shape[0] - 1])
    reports = {shape: _highest(step) for shape, step in steps.items()}
    costs = {selective: _recompute(model, args, kwargs, paths, device_model, selective)
             for selective in (False, True)}
    candidates = [FitCandidate(blocks=count, selective=selective,
                               peak_bytes=reports[count, selective].peak_bytes,
                               recompute_flops=sum(f for f, _ in costs[selective][:count]),
                               recompute_time_s=(sum(t for _, t in costs[selective][:count])
                                                 if device_model else None))
                  for count, selective in shapes]
    chosen = cheapest(candidates, limit)
    if chosen is None:
        raise _does_not_fit(name, given, limit, reports, paths, layout)
    example = example_sizes(model, args, kwargs)
    plan = (chosen.blocks, chosen.selective)

    def most(shape: Shape) -> dict[str, int | None]:
        """The largest batch and length with the candidate ``shape``'s blocks checkpointed."""
        if not search_batch:
            return {}
        if resize is not None:  # the user's resize: steps searched one batch at a time
            return {"batch": largest_size(
                lambda batch: peak(shape, *resize(batch)).peak_bytes <= limit, 1, MOST_ROWS)}
        return largest_sizes(model, args, kwargs, limit, functools.partial(peak, shape),
                             symbolic=layout is None,
                             multiples={"length": layout.cp} if layout is not None else None)

    plain = most((0, False))
    planned = most(plan) if chosen.blocks else plain
    whole, selective = _wrapped_paths(paths, plan)
    return FitPlan(
        model=name, optimizer=optimizer, budget_bytes=limit, budget=given,
        device_model=device_model or "", layout=str(layout or ""),
        peak_rank=reports[plan].rank if layout is not None else None, blocks=paths,
        checkpointed=whole, selective=selective,
        peak_bytes=chosen.peak_bytes, by_kind=reports[plan].by_kind,
        recompute_flops=chosen.recompute_flops, recompute_time_s=chosen.recompute_time_s,
        candidates=candidates, example_batch=example.get("batch", 0),
        largest_batch=planned.get("batch"), largest_batch_without_plan=plain.get("batch"),
        example_length=example.get("length", 0),
        largest_length=planned.get("length"), largest_length_without_plan=plain.get("length"))


#: A candidate's shape: how many blocks it checkpoints, and whether selectively.
Shape = tuple[int, bool]


def _wrapped_paths(paths: list[str], shape: Shape) -> tuple[list[str], list[str]]:
    """The blocks a candidate wraps whole, and those it wraps selectively."""
    count, selective = shape
    return ([], paths[:count]) if selective else (paths[:count], [])


def _every_rank(model: torch.nn.Module, args: tuple, kwargs: dict, layout: Layout,
                wrapped_paths: tuple[list[str], list[str]], **options: Any) -> RanksMemory:
    """Every rank's step of ``model`` split by ``layout``, the blocks at ``wrapped_paths``
    (whole, selective) checkpointed on every rank as torchtitan orders it (`memory_ranks`'s
    ``checkpoint``: between tensor parallelism and FSDP2, after expert parallelism, on a
    pipeline in the stage holding each block)."""
    from ..parallel.rank_memory import memory_ranks

    return memory_ranks(model, args, kwargs, layout=layout, checkpoint=Blocks(*wrapped_paths),
                        **options)


def _highest(step: MemoryReport | RanksMemory) -> MemoryReport:
    """The step's report: on a layout, the rank's with the highest peak."""
    if isinstance(step, RanksMemory):
        return next(report for report in step.ranks if report.rank == step.peak_rank)
    return step


def _gradients(step: MemoryReport | RanksMemory) -> list[int]:
    """The gradient bytes each rank holds (a rank's own: the highest rank may change with the
    plan, and two ranks hold different parameters)."""
    return [report.max_by_kind.gradients for report in getattr(step, "ranks", [step])]


def block_paths(model: torch.nn.Module) -> list[str]:
    """The paths of the blocks checkpointing may wrap, in the order the model holds them:
    the same blocks FSDP2 shards one by one (`exportflops.parallel.fsdp_blocks.blocks_of`)."""
    from ..parallel.fsdp_blocks import blocks_of

    paths = {id(module): path for path, module in model.named_modules()}
    return [paths[id(block)] for block in blocks_of(model)]


def cheapest(candidates: list[FitCandidate], limit: int) -> FitCandidate | None:
    """The candidate whose peak is at most ``limit`` with the least recompute: its time where
    the candidates are timed, else its FLOPs; on a tie the lower peak, then the fewer blocks
    (None: none fits). A larger ``limit`` admits every candidate a smaller one did, so the
    least recompute never grows with the budget."""
    fitting = [c for c in candidates if c.peak_bytes <= limit]
    return min(fitting, default=None, key=lambda c: (
        c.recompute_time_s if c.recompute_time_s is not None else c.recompute_flops,
        c.recompute_flops, c.peak_bytes, c.blocks))


def _loses_gradients(name: str, path: str) -> InputError:
    """Reentrant checkpointing gives a block whose inputs need no gradient (one fed by the raw
    input) none for its parameters (torch warns "None of the inputs have requires_grad=True"):
    the step's gradient bytes shrink, or its output needs no gradient at all."""
    return InputError(
        f"Checkpointing {path!r} of {name} (reentrant) leaves its parameters without "
        f"gradients: its inputs need none. fit() plans models whose blocks take a tensor that "
        f"needs a gradient (an embedding's output, as in a transformer).")


def _recompute(model: torch.nn.Module, args: tuple, kwargs: dict, paths: list[str],
               device_model: str | None, selective: bool) -> list[tuple[int, float | None]]:
    """Each block's recompute FLOPs and roofline seconds (None without a device): the nodes a
    training step's report of the model with every block checkpointed (whole, or
    ``selective``ly) marks recomputed, by the block they ran in (a region's recompute is its
    own ops: the blocks' costs add)."""
    from ..api import analyze
    from ..count.backward import RECOMPUTED

    with wrapped(model, *_wrapped_paths(paths, (len(paths), selective))) as planned:
        report = analyze(planned, args, kwargs, mode="train")
    seconds: dict[str, float] = {}
    if device_model is not None:
        from ..roofline import roofline

        seconds = {n.name: n.predicted_s for n in roofline(report, device_model).nodes}
    rerun = [n for n in report.nodes if n.note.startswith(RECOMPUTED)]
    costs = []
    for path in paths:
        inside = [n for n in rerun if n.module == path or n.module.startswith(path + ".")]
        costs.append((sum(n.cost.flops for n in inside),
                      sum(seconds.get(n.name, 0.0) for n in inside) if seconds else None))
    return costs


def _does_not_fit(name: str, given: str, limit: int, reports: dict[Shape, MemoryReport],
                  paths: list[str], layout: Layout | None) -> DoesNotFitError:
    best = min(reports, key=lambda shape: reports[shape].peak_bytes)
    kinds = reports[best].by_kind
    held = ", ".join(f"{kind} {getattr(kinds, kind)}" for kind in type(kinds).model_fields
                     if getattr(kinds, kind))
    return DoesNotFitError(
        f"No checkpointing plan fits a training step of {name} into {given}"
        f"{f' on each rank of {layout}' if layout is not None else ''}"
        f"{'' if given == f'{limit} bytes' else f' ({limit} bytes)'}: "
        f"the smallest peak reachable is {reports[best].peak_bytes} bytes"
        f"{f' (rank {reports[best].rank})' if layout is not None else ''}, with {best[0]} of "
        f"{len(paths)} blocks checkpointed{' selectively' if best[1] else ''}; it holds "
        f"{held}. Use fewer rows (a smaller batch or sequence), a lighter optimizer "
        f"(optimizer='sgd'), or a larger device.")
