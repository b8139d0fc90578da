"""Work run in a forked process while this one goes on.

`analyze_generation` makes two independent exports, the prompt's forward and the decode step;
on a machine with two or more CPUs the first runs in a child process beside the second, which
takes the whole analysis from the sum of the two to about the longer one. Only where that is
safe and cannot change a result:

- Linux (``os.fork``; macOS's system libraries are not fork-safe);
- CUDA not initialized in this process (a forked child cannot use it);
- every tensor the work reads on ``meta``: nothing is computed, so no kernel thread pool
  (OpenMP) is used in the child, where it could hang.

Otherwise, and whenever the child fails, the work runs here, so errors are raised in this
process with their context. The child's result comes back pickled through a pipe.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ..progress import quiet
from ..torch_internals import pytree

T = TypeVar("T")


@contextlib.contextmanager
def beside(work: Callable[[], T], reads: Any) -> Iterator[Callable[[], T]]:
    """Start ``work`` in a forked child when `can_fork` for the tensors in ``reads`` (a
    module, or a pytree of tensors and modules); yields a function returning its result (the
    child's, or ``work()`` run here). A child still running when the block exits is killed."""
    if not can_fork(reads):
        yield work
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(work, write)
    os.close(write)
    child = {"pid": pid}

    def result() -> T:
        try:
            with os.fdopen(read, "rb") as pipe:
                data = pipe.read()
        finally:
            _, status = os.waitpid(child.pop("pid"), 0)
        if status != 0 or not data:
            return work()
        return pickle.loads(data)

    try:
        yield result
    finally:
        if "pid" in child:  # the caller failed before asking for the result
            os.kill(child["pid"], signal.SIGKILL)
            os.waitpid(child["pid"], 0)
            os.close(read)


def can_fork(reads: Any) -> bool:
    """Forking can only help and cannot hurt (see the module's docstring)."""
    if not sys.platform.startswith("linux") or torch.cuda.is_initialized():
        return False
    if len(os.sched_getaffinity(0)) < 2:
        return False
    tensors = []
    for leaf in pytree.tree_leaves(reads):
        if isinstance(leaf, torch.nn.Module):
            tensors += [*leaf.parameters(), *leaf.buffers()]
        elif isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
    return bool(tensors) and all(t.is_meta for t in tensors)


def _child(work: Callable[[], Any], write: int) -> None:
    """Run ``work``, write its pickled result, and exit without running this process's exit
    handlers (a test runner's, the parent's buffered output)."""
    status = 1
    try:
        with quiet():
            data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
        status = 0
    except BaseException:  # noqa: BLE001 - the parent runs the work itself and raises there
        pass
    finally:
        os._exit(status)
