"""Hugging Face models built from their configs, never a download, with example inputs sized
from the config: the library behind the command's ``hf:`` models.

``models`` builds a model from a config, ``inputs`` and the family modules (``tasks``,
``images``, ``audio``, ``media``, ``session``, ``parent``) size the inputs a forward takes,
``layers`` cuts a config to N blocks, ``needs`` reads which input a forward missed.

From Python, `build` makes a model and its example inputs and `analyze` counts them with the
policies the command uses: built on meta, built again on cpu where meta cannot decide a branch
by the inputs' values, and a forward that read an input that was not made blamed on that
input::

    from exportflops import hf

    report = hf.analyze("llama", layers=2, seq=512)
    model, args, kwargs = hf.build("hf:path/to/config.json", device="cpu", batch=4)

Errors name these functions' arguments (``seq=``, ``batch=``, ``layers=``, ``device=``,
``kwargs=``; ``args=`` is `exportflops.analyze`'s); the command maps them to its flags.

The example inputs come from a registry of small rules, one per input a family's forward takes
(`rules`: ``@input_rule("token_index", "residue_index")``), in ``tasks``, ``audio``, ``images``
and ``modalities``; ``companions`` makes the inputs that follow from others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import BuildError, ExportError, UsageError
from .models import analyze_deciding_on_cpu, hf_model, missed_input, raised_by, split_sizes

if TYPE_CHECKING:
    from ..parallel.layout import Layout
    from ..records import Report


class Built(NamedTuple):
    """A model `build` made and its example inputs, as `exportflops.analyze` takes them:
    ``exportflops.analyze(*built)``."""

    model: Any
    args: tuple
    kwargs: dict


def build(spec: str | os.PathLike, *, device: Any = "meta", layers: int | None = None,
          batch: int = 1, seq: int | None = None, kwargs: dict | None = None,
          use_cache: bool = False) -> Built:
    """The model ``spec`` names and its example inputs, on ``device`` (a name or a
    ``torch.device``; meta allocates nothing and counts the same). ``spec`` is what the
    command's ``hf:`` takes, with or without that prefix: a model_type (``"llama"``: its
    default config), a config.json or the folder that holds it, or ``org/name`` in the local
    Hugging Face cache. ``layers``: at most that many blocks in each stack; ``batch`` and
    ``seq``: the examples' batch and length (tokens, frames or samples; default 128 tokens, or
    the model's positions where fewer); ``kwargs``: keyword inputs added to the examples;
    ``use_cache``: the KV cache kept on (generation analyzes it), else turned off."""
    for name, value in (("batch", batch), ("seq", seq)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UsageError(f"{name}={value!r}: give a count of at least 1.")
    model, args, inputs = hf_model(_spec(spec), _device(device), kwargs, layers=layers,
                                   batch=batch, seq=seq, use_cache=use_cache)
    return Built(model, args, inputs)


def analyze(spec: str | os.PathLike, *, device: Any = None, layers: int | None = None,
            batch: int = 1, seq: int | None = None, kwargs: dict | None = None,
            **analyze_options) -> Report:
    """The `Report` of the model ``spec`` names (`build`'s arguments), counted by
    `exportflops.analyze` with ``analyze_options`` (``mode``, ``strict``, ``dynamic_shapes``,
    ...). ``device`` None: built on meta, and built again on cpu where meta cannot decide a
    branch by values (`analyze_built`); a device given is used as it is."""
    sizes = {"layers": layers, "batch": batch, "seq": seq, "kwargs": kwargs}
    built = build(spec, device="meta" if device is None else device, **sizes)
    on_cpu = partial(build, spec, device="cpu", **sizes) if device is None else None
    return analyze_built(built, on_cpu=on_cpu, **analyze_options)


def analyze_built(built: Built, *, on_cpu: Callable[[], Built] | None = None,
                  **analyze_options) -> Report:
    """`exportflops.analyze` of a model `build` made, with the policies an hf model needs:
    where meta cannot decide a branch by values, ``on_cpu()``'s model and inputs (the same,
    built on cpu: a `Built` or any ``(model, args, kwargs)``) analyzed instead
    (`analyze_deciding_on_cpu`, capped at the memory it may take; never with
    ``dynamic_shapes``, whose sizes the values would fix); where forward read an input that was
    not made, a UsageError naming it; where transformers' own forward raised, a BuildError
    saying where."""
    from ..api import analyze as count

    model, args, kwargs = built
    if analyze_options.get("dynamic_shapes") is not None:
        on_cpu = None
    try:
        return analyze_deciding_on_cpu(partial(count, **analyze_options), model, args, kwargs,
                                       on_cpu)
    except ExportError as error:
        missed = missed_input(error, model, args, kwargs)
        if missed is not None:
            raise UsageError(f"{type(model).__name__}.forward needs {missed!r} (it read it while "
                             f"None in {raised_by(error)}), and exportflops does not know how "
                             f"to make it for this model; pass it with kwargs=.") from error
        if raised_by(error).startswith("transformers"):
            raise BuildError(f"transformers' {type(model).__name__}.forward raised in "
                             f"{raised_by(error)}: {error.torch_message}") from error
        raise


def check_layout(spec: str | os.PathLike, layout: Layout, *, layers: int | None = None,
                 seq: int | None = None, schedule: str | None = None,
                 load_balance: bool = True, example: bool = True) -> None:
    """``layout`` against the config of the model ``spec`` names (`build`'s ``layers`` and
    ``seq``), before anything is built (building and counting a model takes seconds to
    minutes; `split_sizes` reads the config alone): a pipeline's stages against the layers of
    its one stack, a ring's chunks against its example's tokens (``example=False``: the
    caller's own inputs, not checked). An `InputError` naming the arguments
    (`exportflops.parallel.checks.check_sizes`); what the config does not say is left to the
    analysis."""
    from ..parallel.checks import check_sizes

    stack, tokens = split_sizes(_spec(spec), layers=layers, seq=seq)
    check_sizes(layout, model=os.fspath(spec), schedule=schedule, layers=stack,
                tokens=tokens if example else None, load_balance=load_balance,
                capped=stack is not None and layers == stack)


def _spec(spec: str | os.PathLike) -> str:
    return os.fspath(spec).removeprefix("hf:")


def _device(device: Any):
    import torch

    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise UsageError(f"device={device!r} is not a device torch knows ({error}); pass "
                         f"\"meta\", which counts the same without allocating, \"cpu\" or "
                         f"\"cuda\".") from None
