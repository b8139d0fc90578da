"""The flags that split a model over ranks (--tp, --fsdp, --pp, --ep, --cp, --rank and the
options of each): the `Layout` they give, what each does not combine with, and their sizes
against the model's config, all before it is built. What a layout can count is the library's
(`exportflops.parallel.checks`): its errors name arguments (``pp=``, ``schedule=``), written
here as the flags (`targets.flagged`)."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..parallel.layout import Layout
from .targets import flagged

#: The flags giving a split's degree, each a field of `Layout`.
SPLITS = ("pp", "fsdp", "cp", "tp", "ep")

#: What an analysis may refuse, each with whether the command line gives it.
GIVEN = {
    "a saved .pt2": lambda ns: ns.model.endswith(".pt2"),
    "--profile": lambda ns: ns.profile,
    "--trace": lambda ns: ns.trace is not None,
    "--dynamic": lambda ns: bool(ns.dims),
    "--sweep": lambda ns: bool(ns.points),
    "--budget": lambda ns: ns.budget is not None,
    "--device-model": lambda ns: ns.device_model is not None,
    "--generate": lambda ns: ns.generate is not None,
    "--seqlens": lambda ns: ns.seqlens is not None,
    "--format csv": lambda ns: ns.format == "csv",
    "--device cpu/cuda": lambda ns: ns.device not in (None, "meta"),
    "--mode train": lambda ns: ns.mode == "train",
    "--mode train without --pp": lambda ns: ns.mode == "train" and ns.pp is None,
    "--kwargs": lambda ns: bool(ns.kwargs),
    "--view": lambda ns: ns.view is not None,
    "--memory": lambda ns: ns.memory,
    "--split-backward": lambda ns: ns.split_backward,
    "--format csv, md or html": lambda ns: ns.format not in ("table", "json"),
    "--format csv or html": lambda ns: ns.format in ("csv", "html"),
    **{f"--{name}": (lambda ns, name=name: getattr(ns, name) is not None) for name in SPLITS},
}
_BUILT_HERE = ("a saved .pt2", "--dynamic", "--sweep", "--budget", "--generate")
_RECORD = "as a table, Markdown or JSON, or an HTML page"
#: Each analysis of split flags: whether the flags ask for it, what it does, what it refuses.
_REFUSALS = (
    (lambda ns: (ns.tp or ns.fsdp) is not None and (ns.pp or ns.ep or ns.cp) is None,
     "--tp and --fsdp analyze one rank of a model they split on meta or fake tensors",
     (*_BUILT_HERE, "--profile", "--device-model", "--device cpu/cuda")),
    (lambda ns: ns.ep is not None,
     f"--ep analyzes the experts of a model built here, alone, inside --fsdp, over --tp or "
     f"both, {_RECORD}", (*_BUILT_HERE, "--profile", "--device-model", "--seqlens",
                          "--format csv")),
    (lambda ns: ns.cp is not None,
     f"--cp splits the sequence of a model built here, alone or with --fsdp and --tp, "
     f"{_RECORD}", (*_BUILT_HERE, "--profile", "--device-model", "--seqlens", "--format csv")),
    (lambda ns: ns.pp is not None,
     f"--pp splits a model built here into stages, {_RECORD}",
     (*_BUILT_HERE, "--trace", "--seqlens", "--format csv")),
    (lambda ns: ns.pp is not None and ns.profile,
     "--pp with --profile measures each stage where it runs, in place of --device-model's "
     "roofline", ("--device-model",)),
    (lambda ns: ns.pp is not None and (ns.tp or ns.fsdp) is not None,
     "--pp with --tp/--fsdp counts each stage rank on fake tensors under a fake process "
     "group, running nothing (measure the stages with --pp alone)",
     ("--profile", "--device cpu/cuda")),
)


def refuse(ns: argparse.Namespace, asked, what: str, refused: tuple[str, ...]) -> None:
    """Where the flags ask for an analysis (``asked(ns)``), a usage error saying ``what`` it
    does and which of the ``refused`` flags (keys of `GIVEN`) given it does not combine with."""
    given = [name for name in refused if asked(ns) and GIVEN[name](ns)]
    if given:
        raise UsageError(f"{what}: not with {', '.join(given)}.")


def split_given(ns: argparse.Namespace) -> bool:
    """Whether a split flag is given."""
    return any(getattr(ns, name) is not None for name in SPLITS)


def split_layout(ns: argparse.Namespace) -> Layout:
    """The `Layout` the flags give (--ep alone: that many data-parallel ranks), its error a
    usage error naming the flags."""
    degrees = {name: getattr(ns, name) for name in SPLITS if getattr(ns, name) is not None}
    if ns.ep is not None and ns.fsdp is None and ns.tp is None:
        degrees["dp"] = ns.ep
    with split_flagged(ns):
        return Layout(**degrees)


def split_options(ns: argparse.Namespace) -> dict:
    """The split flags as `analyze_ranks` and `memory_ranks` take them: the `Layout`,
    --schedule, --microbatches and --routing."""
    return dict(layout=split_layout(ns), schedule=ns.schedule, microbatches=ns.microbatches,
                routing=ns.routing)


def split_flagged(ns: argparse.Namespace):
    """The library's `InputError` about the split flags' layout, raised in the block, as a
    usage error naming the flags (`targets.flagged`), led by the split flags given."""
    return flagged(split_flags(ns))


def split_flags(ns: argparse.Namespace) -> str:
    """The split flags given, and --schedule and --microbatches, as written (``--pp 2 --tp 2
    --schedule 1f1b``): what an error of their layout names."""
    return " ".join(f"--{name} {getattr(ns, name)}" for name in (*SPLITS, "schedule",
                                                                 "microbatches")
                    if getattr(ns, name) is not None)


def check_splits(ns: argparse.Namespace) -> None:
    """The split flags: their layout, what each refuses (`_REFUSALS`), --cp's ring of two
    ranks or more, and the layout with the options of `analyze_ranks`
    (`exportflops.parallel.checks.check_call`)."""
    from ..parallel.checks import check_call

    layout = split_layout(ns)
    for asked, what, refused in _REFUSALS:
        refuse(ns, asked, what, refused)
    if ns.cp is not None and ns.cp < 2:
        raise UsageError(f"--cp {ns.cp}: a ring splits the sequence over 2 ranks or more: pass "
                         f"--cp 2 or more.")
    with split_flagged(ns):
        check_call(layout, rank=ns.rank, schedule=ns.schedule, microbatches=ns.microbatches,
                   routing=ns.routing, load_balance=not ns.no_load_balance)


def check_split_sizes(ns: argparse.Namespace) -> None:
    """The split flags against the sizes of what they split, an hf: MODEL's config
    (`hf.check_layout`), before the model is built."""
    from .. import hf

    if not ns.model.startswith("hf:"):
        return
    with split_flagged(ns):
        hf.check_layout(ns.model, split_layout(ns), layers=ns.layers, seq=ns.seq,
                        schedule=ns.schedule, load_balance=not ns.no_load_balance,
                        example=not ns.shapes)
