"""The `RuntimeProfile` record from measured samples: medians per node, sums per module along the
tree, the plain and timed totals, and the rates against a peak."""

from __future__ import annotations

import operator
import statistics
from collections import defaultdict

from ..roofline import devices
from . import timing
from ..aggregate import rolled_up
from ..records import ModuleTiming, NodeTiming, Report, RuntimeProfile, Timing

def runtime_profile(report: Report, samples: timing.Samples, peak: devices.Peak | None, *,
                    device: str, timer: str, warmup: int) -> RuntimeProfile:
    """The `RuntimeProfile` of measured ``samples`` of ``report``'s nodes: medians (with min and
    max) per node, their sums per module along the tree, the plain and timed totals, and the
    rates against ``peak``."""
    records = {n.name: n for n in report.nodes}
    nodes = []
    for name, seconds in samples.nodes.items():
        latency = _timing(seconds)
        rate = _rate(records[name].cost.flops, latency.median_s, peak)
        nodes.append(NodeTiming(name=name, module=records[name].module, latency=latency, **rate))
    exclusive: dict[str, float] = defaultdict(float)
    for node in nodes:
        exclusive[node.module] += node.latency.median_s
    inclusive = rolled_up(exclusive, operator.add, float)
    modules = [ModuleTiming(path=m.path, inclusive_s=inclusive[m.path],
                            exclusive_s=exclusive.get(m.path, 0.0),
                            **_rate(m.inclusive.flops, inclusive[m.path], peak))
               for m in report.modules if m.path in inclusive]
    hooked, plain = _timing(samples.hooked), _timing(samples.plain)
    achieved = report.total.flops / plain.median_s
    return RuntimeProfile(
        device=device,
        timer=timer,
        warmup=warmup,
        repeat=len(samples.plain),
        nodes=nodes,
        modules=modules,
        hooked_total=hooked,
        plain_total=plain,
        overhead_s=hooked.median_s - plain.median_s,
        residual_s=plain.median_s - inclusive.get("", 0.0),
        peak_flop_per_s=None if peak is None else peak.flop_per_s,
        peak_source="none (peak_flop_per_s=False)" if peak is None else peak.source,
        achieved_flop_per_s=achieved,
        mfu=None if peak is None else achieved / peak.flop_per_s,
    )


def _timing(samples: list[float]) -> Timing:
    return Timing(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples))


def _rate(flops: int, seconds: float, peak: devices.Peak | None) -> dict[str, float | None]:
    """Achieved FLOP/s and MFU of ``flops`` done in ``seconds``."""
    if seconds <= 0:
        return {"achieved_flop_per_s": None, "mfu": None}
    achieved = flops / seconds
    return {"achieved_flop_per_s": achieved,
            "mfu": None if peak is None else achieved / peak.flop_per_s}
