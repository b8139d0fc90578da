"""Hooks around every call of a model's modules, removed when the block ends."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch


@contextlib.contextmanager
def call_hooks(modules: Iterable[tuple[str, torch.nn.Module]],
               enter: Callable[[str, torch.nn.Module], object],
               leave: Callable[[], object]) -> Iterator[None]:
    """``enter(path, module)`` before each call of each of ``modules`` (path, module), and
    ``leave()`` after it, also when the call raises. What they return is dropped: a hook that
    returns a value would replace the call's inputs or output."""
    def entered(path: str):
        def hook(module, _args) -> None:
            enter(path, module)
        return hook

    def left(*_) -> None:
        leave()

    handles = []
    for path, module in modules:
        handles.append(module.register_forward_pre_hook(entered(path)))
        handles.append(module.register_forward_hook(left, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
