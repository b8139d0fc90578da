"""`FlopsProfiler`: `exportflops.runtime.measure.profile` in a training loop, used as DeepSpeed's
``FlopsProfiler`` is: ``start()`` before a step's forward captures that call's real inputs,
then counts and times it, without breaking the step when that fails."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch

from ..attribution import extra_reprs
from ..compat import written_or_printed
from ..errors import ProfileError
from ..capture.placement import wanted_device
from ..records import Report
from ..render import flops_report
from .measure import NOT_GIVEN, check_iterations, check_peak_argument, profile
from ..torch_internals import pytree


class FlopsProfiler:
    """Count and time one forward of a training loop, as DeepSpeed's ``FlopsProfiler`` is used::

        prof = FlopsProfiler(model)
        for step, batch in enumerate(loader):
            if step == 3:
                prof.start()
            loss = model(batch).sum()          # this forward is captured, counted and timed
            if step == 3:
                prof.stop()
                print(prof.get_total_flops(), prof.get_total_duration())
                prof.print_model_profile()
                prof.end()
            loss.backward(); opt.step(); opt.zero_grad()

    ``start()`` installs a forward pre-hook and a forward hook on ``model``. The pre-hook keeps a
    copy of the next forward's real inputs; when that forward returns, both hooks are removed
    and `profile` exports the model on those inputs, counts the graph and times it (under the
    forward's grad mode, on copies of the buffers and with the RNG forked, so that the step's
    backward and the rest of training are as without the profiler). If the forward raises, the
    hooks are removed and nothing is analyzed. If exporting, counting or timing fails, the
    forward's output is returned as usual, a `RuntimeWarning` says so, and reading the counts
    raises `ProfileError` with the cause. The profiler stores nothing on the model: after
    ``end()`` (or leaving ``with FlopsProfiler(model) as prof:``) its hooks, attributes and
    state are as before ``start()``.

    The arguments are `profile`'s, checked here rather than in the step; ``peak_flops`` is the
    deprecated name of ``peak_flop_per_s``.
    """

    def __init__(self, model: torch.nn.Module, *, warmup: int = 3, repeat: int = 10,
                 device: str | torch.device | None = None,
                 peak_flop_per_s: float | bool | None = None,
                 peak_flops: float | bool | None = NOT_GIVEN) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"FlopsProfiler wraps an nn.Module, got {type(model).__name__}")
        peak = check_peak_argument(peak_flop_per_s, peak_flops, "FlopsProfiler()")
        check_iterations(warmup, repeat, "FlopsProfiler()")
        wanted_device(device)  # a device that cannot be had is refused now, not in the step
        self.model = model
        self.options = dict(warmup=warmup, repeat=repeat, device=device, peak_flop_per_s=peak)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._inputs: tuple[tuple, dict] | None = None
        self._report: Report | None = None
        self._failure: Exception | None = None

    def __enter__(self) -> FlopsProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FlopsProfiler:
        """Capture, count and time the model's next forward."""
        if self._handles:
            raise RuntimeError("FlopsProfiler.start() was called twice without stop()")
        self._inputs, self._report, self._failure = None, None, None
        self._handles = [
            self.model.register_forward_pre_hook(self._capture, with_kwargs=True),
            self.model.register_forward_hook(self._analyze, with_kwargs=True, always_call=True),
        ]
        return self

    def stop(self) -> None:
        """Remove the hooks and forget the captured inputs (if the forward has not run yet,
        nothing will be profiled); the report stays readable."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._inputs = None

    end = stop  # DeepSpeed's name for the last call; nothing is left to release after stop()

    @property
    def report(self) -> Report:
        """The report of the captured forward, with its ``runtime``."""
        if self._failure is not None:
            error = self._failure
            raise ProfileError(
                f"FlopsProfiler has no profile: profiling {type(self.model).__name__}'s forward "
                f"failed (the training step ran as usual; profile(model, args, kwargs) on the "
                f"same inputs raises the same error, to fix its cause) with "
                f"{type(error).__name__}: {error}"
            ) from error
        if self._report is None:
            raise RuntimeError("FlopsProfiler has no profile yet: call start() before the "
                               "model's forward, and read the counts after that forward.")
        return self._report

    def get_total_flops(self) -> int:
        """FLOPs of the captured forward."""
        return self.report.total.flops

    def get_total_macs(self) -> int:
        """Multiply-accumulates of the captured forward."""
        return self.report.total.macs

    def get_total_params(self) -> int:
        """Parameters of the model, tied ones counted once."""
        return self.report.params

    def get_total_duration(self) -> float:
        """Median latency in seconds of the plain forward on the captured inputs."""
        return self.report.runtime.plain_total.median_s

    def print_model_profile(self, *, depth: int = -1, top: int = 3,
                            output_file: str | os.PathLike | None = None, **options: Any) -> str:
        """Print (or write to ``output_file``) `exportflops.render.flops_report` of the capture,
        with each module's ``extra_repr()`` in the tree as DeepSpeed shows it; ``options`` go to
        it (``view=``, ``tablefmt=``, ...). Returns the text."""
        options.setdefault("extra_reprs", extra_reprs(self.model))
        text = flops_report(self.report, depth=depth, top=top, **options)
        written_or_printed(text, output_file)
        return text

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        # A copy: the caller may reuse its input buffers in place once the forward returns.
        self._inputs = pytree.tree_map(
            lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, (args, kwargs))

    def _analyze(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = self._inputs
        self.stop()
        if output is None and sys.exc_info()[1] is not None:
            return  # the forward raised: always_call ran this hook only to remove the hooks
        try:
            self._report = profile(self.model, inputs[0], inputs[1], **self.options)
        except Exception as error:  # torch raises many types; kept for `report` to raise
            self._failure = error
            warnings.warn(f"FlopsProfiler could not profile {type(self.model).__name__}'s "
                          f"forward ({type(error).__name__}: {error}); the step goes on, and "
                          f"reading the counts raises ProfileError", RuntimeWarning, stacklevel=2)
