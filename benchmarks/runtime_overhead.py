"""What per-node timing costs: GPT-2 124M at seq 256 on CPU, the plain eager forward (the
model's own ``forward``) against the replay with a clock around every node, measured in one
run by `exportflops.profile` (the two alternate within each iteration, so a machine that slows
down slows both).

Target: hooked / plain <= 1.15 and |residual| <= 10% of plain, on the medians, where
the residual is the plain forward's latency minus the sum of the nodes' median latencies (time
no node accounts for: module calls, Python between ops). The minima are printed too: on a
shared machine they are the least disturbed figures.

    python benchmarks/runtime_overhead.py [--seq 256] [--warmup 3] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os

import torch

import exportflops
from exportflops.examples.gpt2 import gpt2

RATIO_TARGET, RESIDUAL_TARGET = 1.15, 0.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    options = parser.parse_args()

    torch.manual_seed(0)
    model, args = gpt2("cpu", seq_len=options.seq)
    with torch.no_grad():
        report = exportflops.profile(model, args, warmup=options.warmup, repeat=options.repeat,
                                     peak_flop_per_s=False)
    runtime = report.runtime
    plain, hooked = runtime.plain_total, runtime.hooked_total
    nodes = plain.median_s - runtime.residual_s
    ratio, residual = hooked.median_s / plain.median_s, runtime.residual_s / plain.median_s
    print(f"torch {torch.__version__}, GPT-2 124M, seq {options.seq}, {runtime.device}, "
          f"{options.warmup} warm-up + {options.repeat} measured iterations, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'':24}{'median':>10}{'min':>10}")
    print(f"  plain eager forward   {plain.median_s * 1e3:8.1f}ms{plain.min_s * 1e3:8.1f}ms")
    print(f"  hooked replay         {hooked.median_s * 1e3:8.1f}ms{hooked.min_s * 1e3:8.1f}ms")
    print(f"  hooked / plain        {ratio:10.3f}{hooked.min_s / plain.min_s:10.3f}")
    print(f"  sum of node medians   {nodes * 1e3:8.1f}ms")
    print(f"  residual              {runtime.residual_s * 1e3:8.1f}ms  = {residual:+.1%} of plain")
    passed = ratio <= RATIO_TARGET and abs(residual) <= RESIDUAL_TARGET
    print(f"{'PASS' if passed else 'FAIL'}: target hooked/plain <= {RATIO_TARGET} and "
          f"|residual| <= {RESIDUAL_TARGET:.0%} of plain (medians)")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
