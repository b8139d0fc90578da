"""What the command's MODEL names, built: a built-in example, ``pkg.module:factory``,
``path/to/file.py:factory`` or ``hf:...``; with its example inputs on the asked device."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
from functools import partial
from typing import Any

from .. import hf
from ..errors import BuildError, ExportError, InputError, UnknownDeviceError, UsageError
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
    """MODEL as the flags build it (`build_target`): on ``device`` (default: --device's, meta
    unless given), with --input's shapes, --kwargs and hf:'s sizes (`hf_options`)."""
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


def build_target(spec: str, device, *, shapes=None, kwargs: dict | None = None,
                 hf_options: dict | None = None) -> tuple[Any, Any, dict | None]:
    """The model named by the command's MODEL ``spec``, its positional args and keyword args,
    on ``device``; ``shapes`` (``[(sizes, dtype), ...]``) replace the example args;
    ``hf_options`` (``layers``, ``batch``, ``seq``, ``use_cache``) size an ``hf:`` model and
    its inputs (`hf.build`, its errors in flags)."""
    import torch

    from ..examples import EXAMPLES

    if spec in EXAMPLES:
        model, args = EXAMPLES[spec](device=device)
    elif spec.startswith("hf:"):
        with in_flags():
            model, args, kwargs = hf.build(spec, device=device, kwargs=kwargs,
                                           **(hf_options or {}))
    elif ":" in spec:
        model, args = _call_factory(_resolve_factory(spec), device)
    else:
        raise UsageError(
            f"MODEL {spec!r} is not a built-in example ({', '.join(sorted(EXAMPLES))}), a "
            f"pkg.module:factory or path/file.py:factory, a saved .pt2 or hf:<model_type>. "
            f"See exportflops --help.")
    if shapes:
        # Zeros: valid token ids and images alike; the counts depend on shapes only.
        args = tuple(_zeros(sizes, dtype, device) for sizes, dtype in shapes)
    if args is None:
        raise UsageError(f"{spec} returned a model without inputs: give its inputs with "
                         f"--input SHAPE[:DTYPE], once per positional argument of forward().")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} must return an nn.Module or (module, args), got "
                         f"{type(model).__name__}.")
    return model, args, kwargs


def _resolve_factory(spec: str):
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        module = _import_file(target)
    else:
        # As `python -m` does, so that `pkg.module` resolves from the current directory.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name and target.startswith(error.name):
                raise UsageError(f"cannot import {target!r} ({error}): MODEL "
                                 f"pkg.module:factory names an importable module; for a file "
                                 f"write path/to/file.py:factory.") from None
            raise BuildError(f"importing {target} failed: {error}") from error
        except Exception as error:
            raise BuildError(f"importing {target} failed: {type(error).__name__}: "
                             f"{error}") from error
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            public = sorted(n for n in vars(module) if callable(getattr(module, n))
                            and not n.startswith("_"))
            raise UsageError(f"{target} has no {attr!r}; callables there: "
                             f"{', '.join(public) or 'none'}.")
        factory = getattr(factory, part)
    if not callable(factory):
        raise UsageError(f"{spec} is a {type(factory).__name__}, not a callable that returns a "
                         f"model.")
    return factory


def _import_file(path: str):
    if not os.path.isfile(path):
        raise UsageError(f"no file {path!r}: MODEL path/to/file.py:factory names an existing "
                         f"Python file.")
    name = "_exportflops_model_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Like running the file as a script: its directory is on the path for its own imports.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise BuildError(f"running {path} failed: {type(error).__name__}: {error}") from error
    return module


def _zeros(sizes: list[int], dtype, device):
    """An example input; one too large for the device is the user's option, not a crash."""
    import torch

    try:
        return torch.zeros(sizes, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as error:
        size = math.prod(sizes) * dtype.itemsize
        raise UsageError(f"--input {','.join(map(str, sizes))}: {size:,} bytes cannot be "
                         f"allocated on {device} ({type(error).__name__}); use --device meta, "
                         f"which counts any size without allocating.") from None


def _call_factory(factory, device) -> tuple[Any, Any]:
    import torch
    from ..torch_internals import pytree

    takes_device = _accepts(factory, "device")
    try:
        result = factory(device=device) if takes_device else factory()
    except Exception as error:
        raise BuildError(f"the factory raised {type(error).__name__}: {error}") from error
    if isinstance(result, tuple) and len(result) != 2:
        raise UsageError(
            f"the factory returned a tuple of {len(result)} items "
            f"({', '.join(type(r).__name__ for r in result)}); it must return the model, or "
            f"(model, args) with args the tuple of forward's positional arguments (or a single "
            f"tensor).")
    model, args = result if isinstance(result, tuple) else (result, None)
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not takes_device and isinstance(model, torch.nn.Module):
        # Only when something is elsewhere: moving a model built on fake tensors (--fsdp) to
        # the device it is on fails in torch (it cannot swap a fake parameter).
        if any(t.device != device for t in (*model.parameters(), *model.buffers())):
            model = model.to(device)
        args = pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, args)
    return model, args


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C extensions have no signature
        return False
