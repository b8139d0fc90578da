"""What per-node timing costs: GPT-2 124M at seq 256 on CPU, plain eager forward vs the
replay with a clock around every node, measured in one run by `exportflops.profile`.

Target (issue 7): hooked / plain <= 1.15 and |residual| <= 10% of plain, where the residual is
the plain forward's latency minus the sum of the nodes' median latencies (time no node
accounts for).

    python benchmarks/runtime_overhead.py [--seq 256] [--warmup 3] [--repeat 10]
"""

from __future__ import annotations

import argparse

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
        report = exportflops.profile(model, args, warmup=options.warmup, repeat=options.repeat)
    runtime = report.runtime
    plain, hooked = runtime.plain_total.median_s, runtime.hooked_total.median_s
    ratio, residual = hooked / plain, runtime.residual_s / plain
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPT-2 124M, "
          f"seq {options.seq}, {runtime.device}, median of {options.repeat}")
    print(f"  plain eager forward   {plain * 1e3:9.2f} ms")
    print(f"  hooked replay         {hooked * 1e3:9.2f} ms   hooked / plain = {ratio:.3f}")
    print(f"  sum of node medians   {(plain - runtime.residual_s) * 1e3:9.2f} ms")
    print(f"  residual              {runtime.residual_s * 1e3:9.2f} ms   = {residual:+.1%} of plain")
    passed = ratio <= RATIO_TARGET and abs(residual) <= RESIDUAL_TARGET
    print(f"{'PASS' if passed else 'FAIL'}: target hooked/plain <= {RATIO_TARGET} and "
          f"|residual| <= {RESIDUAL_TARGET:.0%} of plain")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
