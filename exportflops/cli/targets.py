"""MODEL as the flags build it (`exportflops.targets.build_target`) and analyze it, and the
library's errors with the arguments they name written as the command's flags (`flags`)."""

from __future__ import annotations

import contextlib
import re
from functools import partial
from typing import Any

from .. import hf
from ..errors import ExportError, InputError, UnknownDeviceError, UsageError
from ..hf.models import CpuRunError
from ..hf.needs import innermost

#: The library's arguments its errors name, and the command's flag for each: the hf library's
#: (``args=`` is `exportflops.analyze`'s positional inputs: the command's --input) and those of
#: `exportflops.parallel.analyze_ranks` and its `Layout` (`exportflops.parallel.checks`), of
#: `analyze_generation` (`generation.limits.check_options`) and `profile`'s iterations.
FLAGS = {"seq": "--seq", "batch": "--batch", "layers": "--layers", "device": "--device",
         "kwargs": "--kwargs", "args": "--input", "pp": "--pp", "fsdp": "--fsdp", "cp": "--cp",
         "tp": "--tp", "ep": "--ep", "rank": "--rank", "schedule": "--schedule",
         "microbatches": "--microbatches", "routing": "--routing",
         "load_balance": "--no-load-balance", "new_tokens": "--generate", "cache": "--cache",
         "max_cache_len": "--max-cache-len", "warmup": "--warmup", "repeat": "--repeat"}
#: An argument as the library writes it: ``seq=128``, ``layers=N``, ``device="cpu"``,
#: ``schedule='1f1b'``, ``load_balance=False`` (a switch: the flag alone), or bare (``kwargs=``).
_ARGUMENT = re.compile(rf"\b({'|'.join(FLAGS)})=(\"\w+\"|'\w+'|-?\d+|[A-Z]\b|True|False)?")
#: A `Layout` as it prints, ``Layout(fsdp=3, ep=2)``: quoted as it is, the value named.
_LAYOUT = re.compile(r"(Layout\([^)]*\))")


def analyzed(ns, model, args, kwargs, **options):
    """`analyze` of MODEL as built here. Built on meta by default, an hf: model has no values to
    decide its branches by: the library's policy builds it again on cpu (with --input's shapes,
    as on meta)."""
    from ..api import analyze

    if not ns.model.startswith("hf:"):
        return analyze(model, args, kwargs, **options)
    on_cpu = partial(built, ns, device_named("cpu")) if ns.device is None else None
    with in_flags():
        return hf.analyze_built(hf.Built(model, args, kwargs), on_cpu=on_cpu, **options)


def dynamic_shapes(ns, model, args, kwargs, maxima: dict) -> dict:
    """--dynamic's sizes as the ``dynamic_shapes`` of MODEL's export (`capture.dims`), its
    error naming the flag."""
    from ..capture.dims import dynamic_shapes

    with flagged("--dynamic"):
        return dynamic_shapes(model, args, kwargs or {}, ns.dims, maxima)


def device_named(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch.cuda.is_available() is False on this machine "
                         "(is this a CPU build of torch?); use --device meta, which counts the "
                         "same without allocating anything.")
    return torch.device(name)


def built(ns, device=None) -> tuple[Any, Any, dict | None]:
    """MODEL as the flags build it (`exportflops.targets.build_target`, its errors in flags):
    on ``device`` (default: --device's, meta unless given), with --input's shapes, --kwargs
    and hf:'s sizes (`hf_options`)."""
    from ..targets import build_target

    with in_flags():
        return build_target(ns.model, device or device_named(ns.device or "meta"),
                            shapes=ns.shapes, kwargs=ns.kwargs, hf_options=hf_options(ns))


def hf_options(ns) -> dict:
    """--layers, --batch and --seq as `hf.build` takes them, and the KV cache kept on for
    --generate."""
    return {"layers": ns.layers, "batch": 1 if ns.batch is None else ns.batch, "seq": ns.seq,
            "use_cache": ns.generate is not None}


def flags(text: str) -> str:
    """``text`` of the library with each argument it names as the command's flag:
    ``seq=128`` as ``--seq 128``, ``device="cpu"`` as ``--device cpu``, ``kwargs=`` as
    ``--kwargs``, ``load_balance=False`` as ``--no-load-balance``; a `Layout` left as it
    prints."""
    def flag(match: re.Match) -> str:
        value = match[2] if match[2] not in (None, "True", "False") else ""
        return FLAGS[match[1]] + (f" {value.strip(chr(34) + chr(39))}" if value else "")

    return "".join(part if index % 2 else _ARGUMENT.sub(flag, part)
                   for index, part in enumerate(_LAYOUT.split(text)))


@contextlib.contextmanager
def flagged(lead: str = ""):
    """The library's `InputError` (or an unknown device key) raised in the block as a usage
    error, the arguments it names written as flags (`flags`), led by ``lead`` (the flag given)
    where it names none first; and what `in_flags` maps."""
    try:
        with in_flags():
            yield
    except (InputError, UnknownDeviceError) as error:
        text = flags(str(error))
        raise UsageError(text if text.startswith("--") or not lead else f"{lead}: {text}"
                         ) from error


@contextlib.contextmanager
def in_flags():
    """The hf library's errors raised in the block, with the arguments they name as flags
    (`flags`): its UsageErrors, the hint of its run on cpu past its cap (`CpuRunError`), and an
    export failure that quotes a UsageError of its own (raised in a forward it wraps)."""
    try:
        yield
    except UsageError as error:
        raise UsageError(flags(str(error))) from error
    except CpuRunError as error:  # its hint is the library's
        raise ExportError(error.model_name, error.torch_message, flags(error.hint)) from error
    except ExportError as error:
        if not isinstance(innermost(error), UsageError):  # torch's own failure, as it is
            raise
        # torch quotes the library's UsageError, raised in a forward it wraps (a tracker's).
        raise ExportError(error.model_name, flags(error.torch_message), error.hint) from error
