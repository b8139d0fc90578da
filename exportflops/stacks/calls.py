"""`count_calls`: run a model's forward on fake tensors and record each call of a chosen set of
torch functions, with the module it ran in; what a profiler that wraps those functions sees.

DeepSpeed's profiler (`stacks.deepspeed`) replaces attributes (``F.linear``, ``torch.matmul``,
``torch.Tensor.add``) with counting wrappers. Here the same calls are observed instead, by a
`TorchFunctionMode` (nothing of torch is replaced) and forward hooks that only track the module
path (removed on exit, also on error). Two things a mode sees differently, handled here:

- an operator (``a + b``, ``a * b``) reaches the mode as ``Tensor.add`` / ``Tensor.mul``, but
  a wrapper of the attribute ``Tensor.add`` never sees it (Python's ``+`` takes the type's
  slot): the caller's bytecode tells which it was (`OPERATOR_METHODS`);
- the mode sees a call once, at the outermost function: the wrapped functions do not call
  each other by attribute (``F.softmax`` calls ``Tensor.softmax``, unwrapped), so nothing is
  missed.
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from itertools import chain
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..capture.module_hooks import call_hooks
from ..torch_internals import FakeTensorMode

#: The methods Python's binary operators reach: ``a + b`` is ``Tensor.add`` to a mode.
OPERATOR_METHODS = frozenset({torch.Tensor.add, torch.Tensor.mul})


@dataclass(frozen=True)
class Call:
    """One observed call."""

    function: Callable
    """The torch function called (the key of the watched table)."""
    module: str
    """Path of the innermost module it ran in (``""`` for the root)."""
    args: tuple
    kwargs: dict


@cache
def _opcodes(code) -> dict[int, str]:
    return {ins.offset: ins.opname for ins in dis.get_instructions(code)}


def _called_by_operator() -> bool:
    """Whether the frame that called into the mode did so with a binary operator; its
    frame is two above this one (this function, then `_Recorder.__torch_function__`)."""
    frame = sys._getframe(2)
    opname = _opcodes(frame.f_code).get(frame.f_lasti, "")
    return opname.startswith(("BINARY_", "INPLACE_"))


class _Recorder(TorchFunctionMode):
    def __init__(self, watched: frozenset, modules: list[str]):
        super().__init__()
        self.watched, self.modules, self.calls = watched, modules, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.watched and not (func in OPERATOR_METHODS and _called_by_operator()):
            self.calls.append(Call(func, self.modules[-1], args, kwargs))
        return func(*args, **kwargs)


@contextmanager
def _module_paths(model: torch.nn.Module):
    """A stack of the paths of the modules running, kept by forward hooks that are removed
    on exit."""
    stack = [""]
    with call_hooks(((path, module) for path, module in model.named_modules() if path),
                    lambda path, _: stack.append(path), stack.pop):
        yield stack


@contextmanager
def _training(model: torch.nn.Module):
    """The model in train mode (a training step's forward), each module's flag restored."""
    flags = {module: module.training for module in model.modules()}
    model.train()
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


def count_calls(model: torch.nn.Module, kwargs: Mapping[str, Any],
                watched: frozenset) -> list[Call]:
    """The calls of ``watched`` functions one training forward of ``model`` makes, on fake
    copies of its parameters, buffers and the tensors of ``kwargs`` (shapes without data: the
    model is not run, and not changed). Fake, not meta: transformers reads no mask values of
    a fake tensor (``masking_utils.is_tracing``), and those reads fail on meta."""
    fake = FakeTensorMode()

    def faked(value: Any) -> Any:
        return fake.from_tensor(value) if isinstance(value, torch.Tensor) else value

    state = {name: faked(tensor) for name, tensor in chain(model.named_parameters(),
                                                           model.named_buffers())}
    inputs = {name: faked(value) for name, value in kwargs.items()}
    with _training(model), _module_paths(model) as modules, fake:
        recorder = _Recorder(watched, modules)
        with recorder:
            torch.func.functional_call(model, state, (), inputs)
    return recorder.calls
