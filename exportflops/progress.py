"""Progress of one analysis: its stage (export, count, backward, warmup, timing), how far a
repeated stage has come, and the seconds since it began, on one line of stderr.

Opt-in: ``analyze(..., progress=True)`` and ``profile(..., progress=True)``; the command shows
it when stderr is a terminal. The stages are marked with `stage(name)` wherever the work
happens, and a repeated stage's runs with `advance(done, total)`; without an active `Progress`
both are no-ops, so they cost nothing by default.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

STAGES = ("imports", "build", "export", "count", "backward", "warmup", "timing", "render")
"""The stages in order; ``imports`` (transformers, for an ``hf:`` model), ``build`` and ``render``
are the command's."""

_active: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("progress", default=None)


class Progress:
    """Writes ``exportflops: <stage> <seconds> s`` to ``stream``, ``<stage> <done>/<total>``
    while a repeated stage (profile's warmup and timed runs) runs.

    On a terminal the line is redrawn in place every ``interval`` seconds and erased at the end;
    on anything else (a file, a pipe) each stage is one line, written when it begins, and the
    runs are not written (a log gets no line per run)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.stage_name = ""
        self.runs = ""
        """``done/total`` of the stage's repeated runs, or empty."""
        self.start = time.perf_counter()
        self._done = threading.Event()
        self._lock = threading.Lock()

    def begin(self, name: str) -> None:
        with self._lock:
            if name == self.stage_name:  # a nested call (profile's analyze) entering it again
                return
            self.stage_name, self.runs = name, ""
            if self.live:
                self._draw()
            else:
                self.stream.write(f"exportflops: {name} ({self._elapsed()})\n")
                self.stream.flush()

    def advance(self, done: int, total: int) -> None:
        with self._lock:
            self.runs = f"{done}/{total}"
            if self.live:
                self._draw()

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self.start:.1f} s"

    def _draw(self) -> None:
        runs = f" {self.runs}" if self.runs else ""
        self.stream.write(f"\r\033[Kexportflops: {self.stage_name}{runs} {self._elapsed()}")
        self.stream.flush()

    def _redraw_until_done(self) -> None:
        while not self._done.wait(self.interval):
            with self._lock:
                self._draw()

    @contextlib.contextmanager
    def running(self) -> Iterator[Progress]:
        token = _active.set(self)
        redrawer = None
        if self.live:
            redrawer = threading.Thread(target=self._redraw_until_done, daemon=True)
            redrawer.start()
        try:
            yield self
        finally:
            _active.reset(token)
            self._done.set()
            if redrawer is not None:
                redrawer.join()
                self.stream.write("\r\033[K")
                self.stream.flush()


def stage(name: str) -> None:
    """Mark the stage the analysis enters, if a `Progress` is showing; else nothing."""
    progress = _active.get()
    if progress is not None:
        progress.begin(name)


def advance(done: int, total: int) -> None:
    """Mark ``done`` of the current stage's ``total`` runs, if a `Progress` is showing."""
    progress = _active.get()
    if progress is not None:
        progress.advance(done, total)


def showing(progress: bool | Progress) -> contextlib.AbstractContextManager:
    """The context an API call runs in: ``True`` shows a `Progress` on stderr, ``False`` shows
    nothing, a `Progress` is used as given (the command passes one bound to the terminal). A
    call nested in another that already shows one adds nothing."""
    if isinstance(progress, bool):
        if not progress or _active.get() is not None:
            return contextlib.nullcontext()
        progress = Progress()
    if not isinstance(progress, Progress):
        raise TypeError(f"progress must be True, False or an exportflops.progress.Progress, got "
                        f"{type(progress).__name__}")
    return progress.running()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No progress shown inside, whatever the caller shows (a forked child, whose parent
    draws the line)."""
    token = _active.set(None)
    try:
        yield
    finally:
        _active.reset(token)
