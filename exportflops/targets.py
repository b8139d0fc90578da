"""A model named by a spec, built with its example inputs on a device: a built-in example
(`exportflops.examples.EXAMPLES`), ``pkg.module:factory``, ``path/to/file.py:factory`` (a
callable returning the model or ``(model, args)``, taking ``device=`` where it can) or
``hf:...`` (`exportflops.hf.build`). The command's MODEL is such a spec; a per-rank builder
(`exportflops.parallel.analyze_ranks`) can be ``partial(build_target, spec)``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
from typing import Any

from .errors import BuildError, UsageError


def build_target(spec: str, device, *, shapes=None, kwargs: dict | None = None,
                 hf_options: dict | None = None) -> tuple[Any, Any, dict | None]:
    """The model named by the command's MODEL ``spec``, its positional args and keyword args,
    on ``device``; ``shapes`` (``[(sizes, dtype), ...]``) replace the example args;
    ``hf_options`` (``layers``, ``batch``, ``seq``, ``use_cache``) size an ``hf:`` model and
    its inputs (`hf.build`)."""
    import torch

    from . import hf
    from .examples import EXAMPLES

    if spec in EXAMPLES:
        model, args = EXAMPLES[spec](device=device)
    elif spec.startswith("hf:"):
        model, args, kwargs = hf.build(spec, device=device, kwargs=kwargs,
                                       **(hf_options or {}))
    elif ":" in spec:
        model, args = _call_factory(_resolve_factory(spec), device)
    else:
        raise UsageError(
            f"{spec!r} is not a built-in example ({', '.join(sorted(EXAMPLES))}), a "
            f"pkg.module:factory or path/file.py:factory, a saved .pt2 or hf:<model_type> "
            f"(docs/command.md).")
    if shapes:
        # Zeros: valid token ids and images alike; the counts depend on shapes only.
        args = tuple(_zeros(sizes, dtype, device) for sizes, dtype in shapes)
    if args is None:
        raise UsageError(f"{spec} returned a model without inputs: give its inputs with "
                         f"args= SHAPE[:DTYPE], once per positional argument of forward().")
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
        raise UsageError(f"args= {','.join(map(str, sizes))}: {size:,} bytes cannot be "
                         f"allocated on {device} ({type(error).__name__}); pass device=\"meta\", "
                         f"which counts any size without allocating.") from None


def _call_factory(factory, device) -> tuple[Any, Any]:
    import torch
    from .torch_internals import pytree

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
