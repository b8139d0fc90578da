"""The only caller of ``torch.export``: a model, an ExportedProgram or a saved ``.pt2`` in, a
`Captured` program out. Export failures become `ExportError` with a hint."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ExportError


@dataclass(frozen=True)
class Captured:
    program: torch.export.ExportedProgram
    name: str
    """The model's class, or the saved program's path."""
    module: torch.nn.Module | None
    """The user's module when one was given (it names modules that never ran)."""
    args: tuple
    kwargs: dict


def capture(target: Any, args: Any = (), kwargs: dict | None = None, *,
            dynamic_shapes: Any = None) -> Captured:
    if isinstance(target, torch.export.ExportedProgram):
        return Captured(target, "ExportedProgram", None, *_example_inputs(target))
    if isinstance(target, (str, os.PathLike)):
        program = load(target)
        return Captured(program, os.fspath(target), None, *_example_inputs(program))
    if not isinstance(target, torch.nn.Module):
        raise TypeError(
            f"analyze() takes an nn.Module, a torch.export.ExportedProgram or the path of one "
            f"saved with torch.export.save; got {type(target).__name__}."
        )
    args = _as_args(args, target)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict of keyword arguments for "
                        f"{type(target).__name__}.forward, got {type(kwargs).__name__}.")
    name = type(target).__name__
    try:
        program = torch.export.export(target, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # torch raises many types; all become one error with a hint
        raise ExportError(name, _first_lines(error), _hint(error)) from error
    return Captured(program, name, target, args, kwargs or {})


def load(path: str | os.PathLike) -> torch.export.ExportedProgram:
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No saved program at {os.fspath(path)!r}: pass the path of a file written by "
            f"torch.export.save(program, path), or the model itself."
        )
    try:
        return torch.export.load(path)
    except Exception as error:
        raise ValueError(
            f"{os.fspath(path)!r} is not a program saved with torch.export.save "
            f"({type(error).__name__}: {_first_lines(error)}). Re-save it with "
            f"torch.export.save(torch.export.export(model, args), path)."
        ) from error


def _as_args(args: Any, model: torch.nn.Module) -> tuple:
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


_HINTS = [
    (("GuardOnDataDependentSymNode", "data-dependent", "data dependent"),
     "the model branches on a tensor's value. Rewrite the branch with torch.cond (both branches "
     "are then counted), or make the condition depend on shapes only."),
    (("Cache", "pytree", "flatten"),
     "an input or output is an object torch.export cannot flatten. For Hugging Face models "
     "pass use_cache=False (the DynamicCache output), or return plain tensors."),
    (("missing", "positional argument", "unexpected keyword", "takes", "argument"),
     "the example args/kwargs do not match forward()'s signature: pass args as a tuple of "
     "forward's positional arguments and kwargs as a dict."),
]


def _hint(error: Exception) -> str:
    text = f"{type(error).__name__} {error}"
    for needles, hint in _HINTS:
        if any(n in text for n in needles):
            return hint
    return ("see torch.export's message below; torch.export.draft_export(model, args) lists "
            "every problem at once.")


def _first_lines(error: Exception, limit: int = 12) -> str:
    lines = str(error).strip().splitlines()
    return "\n".join(lines[:limit] + (["..."] if len(lines) > limit else []))
