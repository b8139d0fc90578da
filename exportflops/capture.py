"""The only caller of ``torch.export``: a model, an ExportedProgram or a saved ``.pt2`` in, a
`Captured` program out. Export failures become `ExportError` with a hint."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import os
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

from .errors import ExportError, InputError
from .placement import check_inputs, input_name
from .walk import shape_env


@dataclass(frozen=True)
class Captured:
    program: torch.export.ExportedProgram
    name: str
    """The model's class, or the saved program's path."""
    module: torch.nn.Module | None
    """The user's module when one was given (it names modules that never ran)."""
    args: tuple
    kwargs: dict
    """The inputs counted: the user's, else the program's example inputs."""
    given_sizes: dict | None = None
    """For a program already exported and inputs the user gave for it (checked against it):
    the value of each of its dynamic sizes (torch's symbol -> int) in those inputs; for a
    program whose branches were decided by the example's values, each data-dependent size's
    value in the example."""
    value_guards: tuple[str, ...] = ()
    """The conditions on the example's values that decided the program's branches (see
    `Report.value_guards`)."""


def capture(target: Any, args: Any = (), kwargs: dict | None = None, *,
            dynamic_shapes: Any = None, forward_only: bool = False) -> Captured:
    """Export ``target`` (or read the program it is). ``forward_only=True`` is for analyses
    that count the forward alone: export then runs without grad, so that a model's own
    ``no_grad`` regions (Hugging Face's rotary embeddings) leave no grad-mode switches for
    export to wrap into subgraphs, and without the source traceback it records per node; only
    train mode needs those, to find the ops a custom ``autograd.Function``'s forward ran
    (`walk._autograd_function`). Each is about a tenth of export's time; the ops are the same."""
    if isinstance(target, (torch.export.ExportedProgram, str, os.PathLike)):
        return _captured_program(target, args, kwargs, dynamic_shapes)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        raise TypeError(f"analyze() takes a model instance, got the class {target.__name__}: "
                        f"pass {target.__name__}(...).")
    if not isinstance(target, torch.nn.Module):
        raise TypeError(
            f"analyze() takes an nn.Module, a torch.export.ExportedProgram or the path of one "
            f"saved with torch.export.save; got {type(target).__name__}."
        )
    args = as_args(args, target)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict of keyword arguments for "
                        f"{type(target).__name__}.forward, got {type(kwargs).__name__}.")
    name = type(target).__name__
    _check_leaves(name, args, kwargs or {})
    _check_dynamic_dims(target, args, kwargs or {}, dynamic_shapes)
    real = _all_real(target, args, kwargs or {})
    # torch prints the partial graph of a data-dependent failure to stderr; where the values
    # then decide the branches that graph is no news, else it is passed on.
    printed = io.StringIO()
    try:
        with _exporting(forward_only, dynamic_shapes), \
                contextlib.redirect_stderr(printed) if real else contextlib.nullcontext():
            program = torch.export.export(target, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # torch raises many types; all become one error with a hint
        if not (real and data_dependent(error)):
            sys.stderr.write(printed.getvalue())
            raise ExportError(name, _first_lines(error), _hint(error, target)) from error
        return _decided_by_values(target, args, kwargs or {}, dynamic_shapes, forward_only,
                                  error)
    sys.stderr.write(printed.getvalue())
    return Captured(program, name, target, args, kwargs or {})


@contextlib.contextmanager
def _exporting(forward_only: bool, dynamic_shapes: Any) -> Iterator[None]:
    # Export runs the forward on fake tensors; a failure halfway must not leave the caller's
    # random stream advanced (dropout draws), so it runs on a fork of it.
    with torch.random.fork_rng(devices=[]), _forward_only(forward_only), \
            quiet_fake_tensor_log(), _lazy_graph_code(), \
            _fake_dispatch_cache(dynamic_shapes is None):
        yield


def data_dependent(error: BaseException) -> bool:
    """Whether torch's ``error`` is a branch on a tensor's value that shapes cannot decide."""
    return any(n in f"{type(error).__name__} {error}" for n in _DATA_DEPENDENT)


def _all_real(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Every parameter, buffer and input tensor holds values (none on meta, none fake)."""
    tensors = [*model.parameters(), *model.buffers(),
               *(leaf for leaf in pytree.tree_leaves((args, kwargs))
                 if isinstance(leaf, torch.Tensor))]
    return all(t.device.type != "meta" and not isinstance(t, FakeTensor) for t in tensors)


def _decided_by_values(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any,
                       forward_only: bool, error: Exception) -> Captured:
    """A model that branches on its inputs' values (a vision tower splitting by its image
    grid), exported by `torch.export.draft_export`: it runs the model on the real example
    alongside the fake one and decides each such branch as the example does. The counts are
    then the example's, and each condition decided is kept (`Report.value_guards`)."""
    name = type(model).__name__
    try:
        # torch warns of each branch it decides; the report lists them instead.
        with _exporting(forward_only, dynamic_shapes), \
                _quiet(logging.ERROR, "torch.export._draft_export",
                       "torch.fx.experimental.symbolic_shapes"):
            program = torch.export.draft_export(model, args, kwargs,
                                                dynamic_shapes=dynamic_shapes)
    except Exception as draft_error:  # the first error is the one to act on
        raise ExportError(name, _first_lines(error), (
            f"the model branches on a tensor's value, and deciding each branch as the example's "
            f"values do failed too (torch.export.draft_export: {type(draft_error).__name__}: "
            f"{_first_lines(draft_error, 2)}). Rewrite the branch with torch.cond (both "
            f"branches are then counted), or make the condition depend on shapes only."
        )) from error
    guards = tuple(f"{f.data['expr']} is {f.data['result']}" for f in program._report.failures
                   if "expr" in f.data and "result" in f.data)
    values = shape_env(program.graph).real_tensor_prop_unbacked_vals
    sizes = {symbol: int(value) for symbol, value in values.items()
             if isinstance(symbol, sympy.Symbol)}
    return Captured(program, name, model, args, kwargs, sizes, guards)


@contextlib.contextmanager
def _quiet(level: int, *names: str) -> Iterator[None]:
    """torch's loggers ``names`` at ``level`` for the block."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, levels):
            logger.setLevel(old)


def capture_forward(target: Any, args: Any = (), kwargs: dict | None = None, *,
                    dynamic_shapes: Any = None) -> Captured:
    """`capture` for an analysis of the forward alone (``forward_only``: no grad, no source
    tracebacks)."""
    return capture(target, args, kwargs, dynamic_shapes=dynamic_shapes, forward_only=True)


def quiet_fake_tensor_log():
    """Fake tensors log an op that fails (its whole traceback, at ERROR) before raising; the
    error itself reaches the caller (an `ExportError` with torch's message, or the cheap pass's
    fall back to the full export), so the log line would say it twice."""
    return _quiet(logging.CRITICAL, "torch._subclasses.fake_tensor")


def _lazy_graph_code():
    """Graph modules that generate their Python code when first run, not at every graph edit:
    export's passes recompile the graph a dozen times (a few hundred ms on a large model) and
    counting never runs it."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    return _use_lazy_graph_module(True)


def _fake_dispatch_cache(enabled: bool):
    """Fake tensors' cache of op results, off for an export with dynamic sizes: there its
    entries (keyed and checked on symbolic sizes) cost more than they save, a third of the
    export of a GPT-2 block with a dynamic length (`benchmarks/sweep.py`); with static sizes
    it saves a sixth of a Llama-70B export."""
    return torch._dynamo.config.patch(fake_tensor_cache_enabled=enabled)


@contextlib.contextmanager
def _forward_only(forward_only: bool) -> Iterator[None]:
    import torch.fx.config

    if not forward_only:
        yield
        return
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        with torch.no_grad():
            yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def _captured_program(target: Any, args: Any, kwargs: dict | None,
                      dynamic_shapes: Any) -> Captured:
    """A program exported already: its example inputs, and the user's inputs if given, which
    must fit it (the graph's shapes are fixed but for its dynamic sizes)."""
    program = target if isinstance(target, torch.export.ExportedProgram) else load(target)
    name = "ExportedProgram" if program is target else os.fspath(target)
    if dynamic_shapes is not None:
        raise InputError(f"dynamic_shapes applies when exporting a model; {name} is exported "
                         f"already (its dynamic sizes are fixed at export): export the model "
                         f"with dynamic_shapes=, or leave it out.")
    captured = Captured(program, name, None, *_example_inputs(program))
    if not kwargs and (args is None or (isinstance(args, (tuple, list)) and not args)):
        return captured
    given = (args,) if isinstance(args, torch.Tensor) else tuple(args or ())
    sizes = check_inputs(program, name, given, dict(kwargs or {}), error=InputError)
    return Captured(program, name, None, given, dict(kwargs or {}), sizes)


def load(path: str | os.PathLike) -> torch.export.ExportedProgram:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(
            f"{os.fspath(path)!r} {what}: pass the path of a file written by "
            f"torch.export.save(program, path), or the model itself."
        )
    # torch logs the real cause of a failed load as a warning and raises "check the warnings
    # above", which a command that hides torch's log never shows: the cause is kept here.
    causes = _LogRecords()
    logger = logging.getLogger("torch.export")
    logger.addHandler(causes)
    try:
        return torch.export.load(path)
    except Exception as error:
        newer = _version_mismatch(path)
        if newer is not None:
            raise ValueError(f"{os.fspath(path)!r} was saved by another torch: {newer}. This is "
                             f"torch {torch.__version__}: re-export and save the model with it, "
                             f"or analyze with the torch that saved it.") from error
        cause = causes.last() or _first_lines(error)
        raise ValueError(
            f"{os.fspath(path)!r} is not a program saved with torch.export.save "
            f"(torch.export.load: {type(error).__name__}: {cause}). A checkpoint "
            f"written by torch.save (weights or a pickled model) is not a program: build the "
            f"model and analyze it, or save one with "
            f"torch.export.save(torch.export.export(model, args), path)."
        ) from error
    finally:
        logger.removeHandler(causes)


class _LogRecords(logging.Handler):
    """Keeps the last line of what torch logged (the deserializer's real error)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def last(self) -> str:
        for record in reversed(self.records):
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                return f"{type(error).__name__}: {_first_lines(error, 3)}"
        return ""


def _version_mismatch(path: str | os.PathLike) -> str | None:
    """What differs between the archive's versions and this torch's, or None."""
    from torch._export.serde.schema import SCHEMA_VERSION
    try:
        with zipfile.ZipFile(path) as archive:
            saved = {name.rpartition("/")[2]: archive.read(name) for name in archive.namelist()
                     if name.endswith(("archive_version", "models/model.json"))}
    except (OSError, zipfile.BadZipFile):
        return None
    archive_version = saved.get("archive_version", b"0").decode().strip()
    if archive_version != "0":
        return f"archive version {archive_version} (this torch reads version 0)"
    try:
        schema = json.loads(saved.get("model.json", b"{}")).get("schema_version", {})
    except ValueError:
        return None
    major = schema.get("major")
    if major is not None and major != SCHEMA_VERSION[0]:
        return (f"export schema {major}.{schema.get('minor')} (this torch reads "
                f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]})")
    return None


def _check_leaves(name: str, args: tuple, kwargs: dict) -> None:
    """Inputs export cannot take, named before it fails on them with a generic message."""
    for path, leaf in pytree.tree_leaves_with_path((args, kwargs)):
        if type(leaf).__module__ == "numpy" and hasattr(leaf, "shape"):
            kind = type(leaf).__name__
            raise InputError(f"input {input_name(path)} of {name} is a numpy {kind}; "
                             f"pass torch tensors: torch.from_numpy(x) (or torch.as_tensor).")


def _check_dynamic_dims(model: torch.nn.Module, args: tuple, kwargs: dict,
                        dynamic_shapes: Any) -> None:
    """Every dim named in ``dynamic_shapes`` exists in its tensor (torch says only "list
    assignment index out of range")."""
    if dynamic_shapes is None:
        return
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    except TypeError:
        return  # export reports the signature mismatch itself
    if isinstance(dynamic_shapes, dict):
        pairs = [(name, bound.get(name), spec) for name, spec in dynamic_shapes.items()]
    else:
        pairs = list(zip(bound, bound.values(), dynamic_shapes))
    for name, value, spec in pairs:
        if not isinstance(value, torch.Tensor) or spec is None:
            continue
        dims = list(spec) if isinstance(spec, dict) else list(range(len(spec)))
        for dim in dims:
            if not isinstance(dim, int) or not -value.ndim <= dim < value.ndim:
                raise InputError(
                    f"dynamic_shapes[{name!r}] names dim {dim!r}, but {name} of "
                    f"{type(model).__name__} has {value.ndim} dims (shape "
                    f"{list(value.shape)}): use dims 0..{value.ndim - 1}.")


def as_args(args: Any, model: torch.nn.Module) -> tuple:
    if isinstance(args, tuple):
        return args
    if isinstance(args, list):
        return tuple(args)
    if isinstance(args, torch.Tensor):
        return (args,)
    raise TypeError(
        f"args must be a tuple of {type(model).__name__}.forward's positional arguments "
        f"(or a single tensor), got {type(args).__name__}."
    )


def _example_inputs(program: torch.export.ExportedProgram) -> tuple[tuple, dict]:
    example = program.example_inputs
    return example if example is not None else ((), {})


_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "data dependent")
_HINTS = [
    # Before the signature hint: torch's device message names the "argument" it checked.
    (("devices, meta and cpu", "devices, cpu and meta"),
     "the model's code makes a tensor on cpu (torch.tensor or torch.arange without device=) "
     "and meets the model's meta tensors. Analyze the model on cpu (the command: --device cpu, "
     "with --layers N to keep it small), or create that tensor on the model's device."),
    (("Inference tensors", "inference tensor"),
     "the model's parameters (or inputs) were created under torch.inference_mode(), and autograd "
     "cannot train them. For mode='train', build the model and inputs outside inference_mode."),
    (_DATA_DEPENDENT,
     "the model branches on a tensor's value. With real tensors (not meta), exportflops decides "
     "each such branch as the example's values do (torch.export.draft_export) and counts that "
     "path: build the model and inputs on cpu (the command: --device cpu, with --layers N to "
     "keep it small). Or rewrite the branch with torch.cond (both branches are then counted), "
     "or make the condition depend on shapes only."),
    (("Cache", "pytree", "flatten"),
     "an input or output is an object torch.export cannot flatten. For Hugging Face models "
     "pass use_cache=False (the DynamicCache output), or return plain tensors."),
    (("missing", "positional argument", "unexpected keyword", "takes", "argument"),
     "the example args/kwargs do not match forward()'s signature: pass args as a tuple of "
     "forward's positional arguments and kwargs as a dict."),
    # torch's shape checks in mm, broadcasting and convolution
    (("must have same reduction dim", "cannot be multiplied", "must match the size of tensor",
      "expected input", "size mismatch"),
     "an op rejected the example inputs' sizes: give args the shapes (and dtypes) forward() "
     "expects."),
]


def _hint(error: Exception, model: torch.nn.Module) -> str:
    quantized = sorted({type(m).__name__ for m in model.modules()
                        if type(m).__module__.startswith("torch.ao.nn.quantized")})
    if quantized:
        return (f"the model holds eager-mode quantized modules ({', '.join(quantized)}), whose "
                f"packed weights torch.export cannot trace. Analyze the float model before "
                f"quantize_dynamic: an int8 matmul does the same MACs as the float one.")
    text = f"{type(error).__name__} {error}"
    for needles, hint in _HINTS:
        if any(n in text for n in needles):
            return hint
    return ("see torch.export's message below; torch.export.draft_export(model, args) lists "
            "every problem at once.")


def _first_lines(error: Exception, limit: int = 12) -> str:
    lines = str(error).strip().splitlines()
    return "\n".join(lines[:limit] + (["..."] if len(lines) > limit else []))
