"""The timing engine: a plain forward and a replay with a clock around every timed node,
alternated over ``warmup + repeat`` iterations.

- CPU: ``time.perf_counter_ns`` (a monotonic clock) just around the op call; argument lookup
  is outside;
- CUDA: a pair of CUDA events around each node and one ``torch.cuda.synchronize()`` per
  iteration, after which the events are read: the host never waits on the GPU between nodes.

Each iteration runs the plain callable and the timed replay, in alternating order so that a
slow drift of the machine hits both alike. Only the ``repeat`` iterations after the ``warmup``
ones are kept. The engine knows graphs, nodes and clocks; what the nodes count and how the
samples are summarized is the caller's (`exportflops.runtime.measure`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..progress import advance, stage

#: One run's inputs: the call's ``(args, kwargs)`` for the plain callable and the graph's
#: placeholder values, flattened, for the replay.
Inputs = tuple[tuple, dict, list]


@dataclass(frozen=True)
class Samples:
    """Seconds per measured iteration (warm-up iterations are not in here)."""

    nodes: dict[str, list[float]]
    """Per timed node, by node name, in the order the nodes were given."""
    hooked: list[float]
    """The whole timed replay."""
    plain: list[float]
    """The whole plain call."""
    clock: str
    """How the clock reads, and what an empty timed region reads on it."""


def measure(graph_module: torch.fx.GraphModule, nodes: Sequence[torch.fx.Node],
            inputs: Callable[[], Inputs], plain: Callable[..., Any], on: torch.device,
            warmup: int, repeat: int) -> Samples:
    """Time ``plain(*args, **kwargs)`` and the replay of ``graph_module`` with a clock around
    each of ``nodes`` (the others run untimed), alternating; ``inputs()`` gives each run its
    inputs (outside the timed region)."""
    clock = (CudaClock if on.type == "cuda" else CpuClock)(len(nodes))
    replay = TimedReplay(graph_module, {node: slot for slot, node in enumerate(nodes)}, clock)

    def run_plain() -> Callable[[], float]:
        args, kwargs, _ = inputs()
        return clock.whole(lambda: plain(*args, **kwargs))

    def run_hooked() -> Callable[[], float]:
        _, _, flat = inputs()
        return clock.whole(lambda: replay.run(*flat, enable_io_processing=False))

    node_s: list[list[float]] = [[] for _ in nodes]
    hooked_s, plain_s = [], []
    for i in range(warmup + repeat):
        # The line moves through warmup and timing run by run: at 1024 tokens on two cores a
        # GPT-2 pair of runs takes half a second, and the default 60 pairs half a minute.
        warming = i < warmup
        stage("warmup" if warming else "timing")
        advance(i + 1 if warming else i + 1 - warmup, warmup if warming else repeat)
        if i % 2 == 0:
            plain_time, hooked_time = run_plain(), run_hooked()
        else:
            hooked_time, plain_time = run_hooked(), run_plain()
        clock.synchronize()  # the iteration's one synchronize; every clock reading is final
        if i < warmup:
            continue
        plain_s.append(plain_time())
        hooked_s.append(hooked_time())
        for samples, seconds in zip(node_s, clock.node_seconds()):
            samples.append(seconds)
    return Samples({node.name: s for node, s in zip(nodes, node_s)}, hooked_s, plain_s,
                   clock.describe())


class CpuClock:
    """Per-node and whole-call timing on the CPU: perf_counter_ns, read just around the call."""

    def __init__(self, slots: int) -> None:
        self.starts = [0] * slots
        self.ends = [0] * slots

    def node_start(self, slot: int) -> None:
        self.starts[slot] = time.perf_counter_ns()

    def node_end(self, slot: int) -> None:
        self.ends[slot] = time.perf_counter_ns()

    def whole(self, run: Callable[[], Any]) -> Callable[[], float]:
        """Run ``run``; the returned function reads its seconds once the clock is synchronized."""
        start = time.perf_counter_ns()
        run()
        elapsed = (time.perf_counter_ns() - start) / 1e9
        return lambda: elapsed

    def synchronize(self) -> None:
        pass  # the CPU's readings are final when taken

    def node_seconds(self) -> list[float]:
        return [(e - s) / 1e9 for s, e in zip(self.starts, self.ends)]

    @staticmethod
    def describe() -> str:
        info = time.get_clock_info("perf_counter")
        empty = statistics.median(-time.perf_counter_ns() + time.perf_counter_ns()
                                  for _ in range(1001))
        kind = "monotonic" if info.monotonic else "NOT monotonic"
        return (f"time.perf_counter_ns around each node ({kind}, {info.implementation}, "
                f"resolution {info.resolution:.0e} s, an empty timed region reads {empty:.0f} ns)")


class CudaClock(CpuClock):
    """A pair of CUDA events per node; elapsed times are read after the iteration's one
    synchronize, so the host never waits on the GPU between nodes."""

    def __init__(self, slots: int) -> None:
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(slots)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(slots)]

    def node_start(self, slot: int) -> None:
        self.starts[slot].record()

    def node_end(self, slot: int) -> None:
        self.ends[slot].record()

    def whole(self, run: Callable[[], Any]) -> Callable[[], float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        return lambda: start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def node_seconds(self) -> list[float]:
        return [s.elapsed_time(e) / 1e3 for s, e in zip(self.starts, self.ends)]

    @staticmethod
    def describe() -> str:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(101)]
        for start, end in pairs:
            start.record()
            end.record()
        torch.cuda.synchronize()
        empty = statistics.median(start.elapsed_time(end) * 1e3 for start, end in pairs)
        return (f"a pair of torch.cuda.Event per node, one synchronize per iteration (an empty "
                f"event pair reads {empty:.1f} us)")


class TimedReplay(torch.fx.Interpreter):
    """Runs the graph node by node; the clock brackets the op call of every timed node."""

    def __init__(self, module: torch.fx.GraphModule, slots: dict[torch.fx.Node, int],
                 clock: CpuClock) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.slots, self.clock = slots, clock

    def run_node(self, n: torch.fx.Node) -> Any:
        slot = self.slots.get(n)
        if slot is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        self.clock.node_start(slot)
        out = n.target(*args, **kwargs)
        self.clock.node_end(slot)
        return out
