"""The sizes a model reads from its inputs' values on one real run: ``nonzero``'s counts.

Export leaves such a size as an unbacked symbol (``u0``) in the counts: an MoE's tokens per
expert (``torch.where(routing == e)``) is one. Their values on the example tell how many there
are per token, which `exportflops.flops_per_batch` needs to evaluate a step it never runs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..torch_internals import TorchDispatchMode, pytree
from .export import run_kept

#: The ops whose output length is read from their input's values, each with how to read it.
#: ``torch.where(mask)`` and boolean indexing both run ``nonzero``.
_READERS = {
    torch.ops.aten.nonzero.default: lambda out: out.shape[0],
    torch.ops.aten.masked_select.default: lambda out: out.numel(),
}


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        reader = _READERS.get(func)
        if reader is not None:
            self.sizes.append(int(reader(out)))
        return out


def value_read_sizes(model: torch.nn.Module, args: tuple, kwargs: dict) -> list[int]:
    """The length of each output sized by values, in the order one forward of ``model`` on
    these (real) inputs computes them; the model's buffers are restored after the run."""
    recorder = _Recorder()
    with run_kept(model, args, kwargs), torch.no_grad(), recorder:
        model(*args, **kwargs)
    return recorder.sizes


def on_meta(tree: Any) -> bool:
    """Whether any tensor of ``tree`` (a model's inputs) is on the meta device: no values."""
    return any(isinstance(leaf, torch.Tensor) and leaf.is_meta
               for leaf in pytree.tree_leaves(tree))
