"""torch's loggers silenced for a block: the failures they would log reach the caller as
errors or records already."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(level: int, *names: str) -> Iterator[None]:
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


def quiet_fake_tensor_log() -> contextlib.AbstractContextManager:
    """Fake tensors log an op that fails (its whole traceback, at ERROR) before raising; the
    error itself reaches the caller (an `ExportError` with torch's message, the cheap pass's
    fall back to the full export, a backward op's record), so the log line would say it
    twice."""
    return quiet(logging.CRITICAL, "torch._subclasses.fake_tensor")


def quiet_capture_log() -> contextlib.AbstractContextManager:
    """What torch logs while a capture fails or falls back: the shape environment's warnings
    ("Unable to find user code corresponding to {u0}" before a branch on a value) and fake
    tensors' failing ops. The failure reaches the caller as an `ExportError` with torch's
    message, or the values decide the branch and the report lists the decision."""
    return quiet(logging.CRITICAL, "torch._subclasses.fake_tensor",
                 "torch.fx.experimental.symbolic_shapes")
