"""The checks of the flags that split a model over ranks: --tp, --fsdp, --pp, --ep, --cp and
--rank (`options.check` calls `check_splits`), and their sizes against the model's, before it
is built (`check_split_sizes`)."""

from __future__ import annotations

import argparse

from ..errors import LayoutError, UsageError
from ..parallel.layout import Layout

#: The flags giving a split's degree, each a field of `Layout`.
SPLITS = ("pp", "fsdp", "cp", "tp", "ep")


def split_layout(ns: argparse.Namespace) -> Layout:
    """The `Layout` the flags give (--ep alone: that many data-parallel ranks), its error a
    usage error naming the flags."""
    degrees = {name: getattr(ns, name) for name in SPLITS if getattr(ns, name) is not None}
    if ns.ep is not None and ns.fsdp is None and ns.tp is None:
        degrees["dp"] = ns.ep
    try:
        return Layout(**degrees)
    except LayoutError as error:
        raise UsageError(f"{split_flags(ns)}: {error}") from error


def split_flags(ns: argparse.Namespace) -> str:
    """The split flags given, as written (``--fsdp 2 --tp 4``)."""
    return " ".join(f"--{name} {getattr(ns, name)}" for name in SPLITS
                    if getattr(ns, name) is not None)


def check_splits(ns: argparse.Namespace) -> None:
    """--tp, --fsdp, --pp, --ep, --cp and --rank: degrees and ranks in range, and refused with
    what each does not combine with."""
    world = split_layout(ns).world_size
    if (ns.tp is not None or ns.fsdp is not None) and ns.pp is None and ns.ep is None \
            and ns.cp is None:
        # with --pp, --ep or --cp: their own checks
        if not 0 <= ns.rank < world:
            raise UsageError(f"--tp and --fsdp take a degree >= 1 and --rank one of "
                             f"0..{max(world - 1, 0)}, got --tp {ns.tp} --fsdp {ns.fsdp} "
                             f"--rank {ns.rank}.")
        if ns.model.endswith(".pt2") or ns.profile or ns.dims or ns.points or ns.budget \
                or ns.device_model or ns.generate is not None \
                or ns.device not in (None, "meta"):
            raise UsageError("--tp and --fsdp analyze one rank of a model they split on meta or "
                             "fake tensors: not a saved .pt2, and not with --profile, "
                             "--dynamic, --sweep, --budget, --device-model, --generate or "
                             "--device cpu/cuda.")
    elif ns.rank and ns.pp is None and ns.ep is None and ns.cp is None:
        raise UsageError("--rank picks a rank of --tp, --fsdp, --pp, --ep or --cp N: pass one "
                         "of them too.")
    _check_pipeline(ns, world)
    _check_experts(ns, world)
    _check_context(ns, world)


def _alone(ns: argparse.Namespace, flag: str, what: str, composes: tuple[str, ...] = ()) -> None:
    """``flag`` (--ep, --cp) refused with any other split but ``composes``, or analysis of its
    own."""
    splits = [name for name in ("--tp", "--fsdp", "--pp", "--ep", "--cp")
              if name != flag and name not in composes and getattr(ns, name[2:]) is not None]
    if (splits or ns.model.endswith(".pt2") or ns.profile or ns.dims or ns.points or ns.budget
            or ns.device_model or ns.generate is not None or ns.seqlens is not None
            or ns.format not in ("table", "md", "json", "html")):
        others = [name for name in ("--tp", "--fsdp", "--pp", "--ep", "--cp")
                  if name != flag and name not in composes]
        raise UsageError(f"{flag} {what}, as a table, Markdown or JSON, or an HTML page: not a "
                         f"saved .pt2, and not with {', '.join(others)}, --profile, --dynamic, "
                         f"--sweep, --budget, --device-model, --generate or --seqlens.")


def _check_experts(ns: argparse.Namespace, world: int) -> None:
    """--ep N, alone with --rank in 0..N-1, inside --fsdp F with --rank in 0..F-1, over --tp N
    ranks with --rank in 0..N-1, or inside --fsdp F over --tp T with --rank in 0..F x T - 1
    (N dividing the ranks, torchtitan's constraint), and --routing parsed (counts per expert);
    refused with what it does not combine with."""
    if ns.ep is None:
        if ns.routing is not None:
            raise UsageError("--routing gives the token copies per expert of --ep N: pass --ep.")
        return
    if ns.tp is not None and ns.fsdp is None and ns.tp != ns.ep:
        raise UsageError(f"--ep {ns.ep} --tp {ns.tp}: expert parallelism over tensor-parallel "
                         f"ranks without --fsdp is laid out with --ep equal to --tp (more ranks "
                         f"holding the same experts are sharded by FSDP2): pass --ep {ns.tp}, "
                         f"or add --fsdp F.")
    if not 0 <= ns.rank < world:
        ranks = " x ".join(f"{name} {getattr(ns, name)}" for name in ("fsdp", "tp")
                           if getattr(ns, name) is not None) or "ep"
        raise UsageError(f"--ep takes a degree >= 1 and --rank one of 0..{max(world - 1, 0)} "
                         f"(the {ranks} ranks), got --ep {ns.ep} --rank {ns.rank}.")
    _alone(ns, "--ep", "analyzes the experts of a model built here, alone, inside --fsdp, "
           "over --tp or both", composes=("--fsdp", "--tp"))
    if ns.routing is not None:
        try:
            ns.routing = [int(part) for part in ns.routing.split(",")]
        except ValueError:
            ns.routing = [-1]
        if min(ns.routing) < 0:
            raise UsageError("--routing takes token copies per expert, counts >= 0 separated "
                             "by commas (10,30,20,4).")


def _check_context(ns: argparse.Namespace, world: int) -> None:
    """--cp N, alone with --rank in 0..N-1, or on torchtitan's mesh (fsdp, cp, tp) with --fsdp F
    (F rings of N ranks, each running its own batch) and --tp T (T ranks at each place of a
    ring) with --rank in 0..F x N x T - 1; refused with what it does not combine with."""
    if ns.cp is None:
        if ns.no_load_balance:
            raise UsageError("--no-load-balance splits the sequence of --cp N: pass --cp.")
        return
    if ns.cp < 2 or not 0 <= ns.rank < world:
        mesh = " x ".join(name for name in ("fsdp", "cp", "tp")
                          if name == "cp" or getattr(ns, name) is not None)
        given = "".join(f" --{name} {getattr(ns, name)}" for name in ("fsdp", "tp")
                        if getattr(ns, name) is not None)
        raise UsageError(f"--cp takes a degree >= 2 and --rank one of 0..{max(world - 1, 0)} "
                         f"(the {mesh} ranks), got --cp {ns.cp}{given} --rank {ns.rank}.")
    _alone(ns, "--cp", "splits the sequence of a model built here, alone or with --fsdp and "
           "--tp", composes=("--fsdp", "--tp"))


def _check_pipeline(ns: argparse.Namespace, world: int) -> None:
    """--pp N analyzes a model built here, alone (on meta, or measured on cpu or cuda with
    --profile) or on a mesh with --tp/--fsdp (--rank a global rank of pp x fsdp x tp):
    --schedule and --microbatches need it."""
    if ns.pp is None:
        if ns.schedule is not None or ns.microbatches is not None:
            raise UsageError("--schedule and --microbatches lay out a pipeline: add --pp N.")
        return
    if (ns.microbatches is not None and ns.microbatches < 1) or not 0 <= ns.rank < world:
        raise UsageError(f"{split_flags(ns)}: --pp takes --microbatches M >= 1 and --rank one "
                         f"of the {world} ranks of pp x fsdp x tp, 0..{world - 1}; got "
                         f"--rank {ns.rank}.")
    if ns.ep is not None or ns.cp is not None:
        raise UsageError("--pp composes with --tp and --fsdp, not with --ep or --cp yet: "
                         "analyze those alone.")
    if ns.model.endswith(".pt2") or ns.trace \
            or ns.dims or ns.points or ns.budget or ns.generate is not None \
            or ns.seqlens is not None or ns.format == "csv":
        raise UsageError("--pp splits a model built here into stages and prints a table, "
                         "Markdown or JSON, or an HTML page: not a saved .pt2, and not with "
                         "--trace, --dynamic, --sweep, --budget, --generate, --seqlens or "
                         "--format csv.")
    if ns.profile and ns.device_model is not None:
        raise UsageError("--pp with --profile measures each stage where it runs: not with "
                         "--device-model, whose roofline it replaces.")
    _check_schedule(ns)
    if (ns.tp is not None or ns.fsdp is not None) and (ns.profile or ns.device not in
                                                        (None, "meta")):
        raise UsageError("--pp with --tp/--fsdp counts each stage rank on fake tensors under a "
                         "fake process group: nothing runs, so not with --profile or --device "
                         "cpu/cuda; measure the stages with --pp alone.")


def check_split_sizes(ns: argparse.Namespace, *, layers: int | None = None,
                      tokens: int | None = None) -> None:
    """The split flags against the sizes of what they split, before the model is built
    (building and counting a model takes seconds to minutes): --pp's stages against the
    ``layers`` of MODEL's one stack, --cp's chunks against the ``tokens`` of its example.
    ``layers`` or ``tokens`` None: known once MODEL is built, and checked then."""
    if ns.pp is not None and layers is not None:
        _check_stages(ns, layers)
    if ns.cp is not None and tokens is not None:
        pieces = ns.cp if ns.no_load_balance else 2 * ns.cp
        if tokens % pieces:
            chunks = ("--cp chunks, --no-load-balance" if ns.no_load_balance else
                      "2 x --cp: torch's load balancing gives each rank a chunk from each end")
            raise UsageError(f"{context_flags(ns)}: {ns.model}'s example has {tokens} "
                             f"tokens, which do not split into {pieces} equal chunks "
                             f"({chunks}); pass --seq N with N a multiple of {pieces}.")


def context_flags(ns: argparse.Namespace) -> str:
    """--cp and the degrees of the mesh it sits on, as given: what an error of theirs names."""
    return f"--cp {ns.cp}" + "".join(f" --{name} {getattr(ns, name)}" for name in
                                     ("fsdp", "tp") if getattr(ns, name) is not None)


def _check_schedule(ns: argparse.Namespace) -> None:
    """--schedule a schedule of the table, and with --microbatches one torch lays out: its
    order needs the ranks, the stages per rank and the microbatches alone."""
    from ..errors import InputError
    from ..parallel.pipeline.schedules import SCHEDULES, pipeline_order

    schedule = ns.schedule or "1f1b"
    if schedule not in SCHEDULES:
        raise UsageError(f"--schedule {schedule}: the schedules are {', '.join(SCHEDULES)} "
                         f"(docs/pipeline.md).")
    try:
        pipeline_order(schedule, ns.pp, ns.microbatches or ns.pp, _per_rank(schedule))
    except InputError as error:
        raise UsageError(f"--pp {ns.pp} --schedule {schedule}: {error}") from error


def _per_rank(schedule: str) -> int:
    """The stages on each of --pp's ranks: a looped schedule runs two."""
    from ..parallel.pipeline.schedules import SCHEDULES

    return 2 if SCHEDULES[schedule].looped else 1


def _check_stages(ns: argparse.Namespace, layers: int) -> None:
    """--pp's stages, each of whole layers, no more than MODEL's ``layers``."""
    schedule = ns.schedule or "1f1b"
    per_rank = _per_rank(schedule)
    stages = ns.pp * per_rank
    if stages > layers:
        fixes = [f"--pp {layers // per_rank} or less"] if layers >= per_rank else []
        if ns.layers == layers:  # the cap, not the config, holds it to that depth
            fixes.append(f"--layers {stages}")
        if per_rank > 1:
            fixes.append("a schedule with one stage per rank")
        looped = f" ({per_rank} on each of --pp {ns.pp} ranks)" if per_rank > 1 else ""
        capped = f" (--layers {ns.layers})" if ns.layers == layers else ""
        raise UsageError(f"--pp {ns.pp} --schedule {schedule}: {ns.model} has {layers} "
                         f"layers{capped}, and a stage holds whole layers: {stages} "
                         f"stages{looped} need {stages} layers or more; pass "
                         f"{', or '.join(fixes)}.")
