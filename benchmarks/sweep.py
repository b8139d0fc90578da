"""FLOPs of GPT-2 124M (on meta) at 64 sequence lengths, three ways, timed in one run:

1. symbolic: one ``analyze(model, args, dynamic_shapes=...)`` with a dynamic ``seq``
   (torch.export.Dim; the fast path traces one of the 12 blocks), then the 64 points, either
   as 64 full ``report.evaluate(seq=...)`` (every module, operator and node) or as the total
   FLOPs polynomial, compiled once (``sympy.lambdify``) and evaluated 64 times;
2. 64 concrete ``analyze`` calls (one export each);
3. 64 runs of ``torch.utils.flop_counter.FlopCounterMode`` over the model's forward.

Target: the symbolic way (totals) at least as many times faster than FlopCounterMode as there
are points, that is one symbolic analysis no dearer than one FlopCounterMode run. Every way's totals
are checked against each other: ours equal each other at every point; FlopCounterMode counts
matmul FLOPs only (and on meta SDPA runs its math path, two bmm), so it is compared with our
``matmul_flops``. Times are this process's CPU seconds (other processes share the machine);
the symbolic analysis is this model's first, as a sweep's is. That first analysis is one
sample of some 0.2 s, and on a shared machine one sample moves by a third between runs:
``--repeat N`` runs the whole comparison in N fresh processes, one after another, and gives the
verdict on the median of their ratios.

    python benchmarks/sweep.py [--points 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import sympy
import torch
from torch.export import Dim
from torch.utils.flop_counter import FlopCounterMode

import exportflops
from exportflops import analyze
from exportflops.examples.gpt2 import GPT, GPTConfig, gpt2

def seq_lengths(points: int) -> list[int]:
    return [16 * (i + 1) for i in range(points)]  # 16 .. 1024 for 64 points


def symbolic(lengths: list[int]) -> tuple[dict[str, float], list[int], list[int]]:
    start = time.process_time()
    model, args = gpt2("meta", seq_len=lengths[0])
    report = analyze(model, args, dynamic_shapes=({1: Dim("seq", max=1024)},))
    analyzed = time.process_time()
    full = [report.evaluate(seq=n).total.matmul_flops for n in lengths]
    evaluated = time.process_time()
    polynomial = report.total.matmul_flops
    seq = next(iter(polynomial.free_symbols))
    # Compiled once to Python integer arithmetic (exact: the polynomial's coefficients are
    # ints), as a sweep of many points would; sympy's subs costs some 0.7 ms a point.
    total_at = sympy.lambdify(seq, polynomial, modules="math")
    totals = [int(total_at(n)) for n in lengths]
    done = time.process_time()
    times = {"analyze once (export and count)": analyzed - start,
             "64 full evaluate()": evaluated - analyzed,
             "64 total-polynomial evaluations (compiled once)": done - evaluated}
    return times, full, totals


def concrete(lengths: list[int]) -> tuple[float, list[int]]:
    start = time.process_time()
    totals = [analyze(*gpt2("meta", seq_len=n)).total.matmul_flops for n in lengths]
    return time.process_time() - start, totals


def flop_counter(lengths: list[int]) -> tuple[float, list[int]]:
    start = time.process_time()
    totals = []
    for n in lengths:
        model, (idx,) = gpt2("meta", seq_len=n)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(idx)
        totals.append(counter.get_total_flops())
    return time.process_time() - start, totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes, each with a cold first analysis (default 1)")
    options = parser.parse_args()
    if options.repeat > 1:
        return repeated(options.points, options.repeat)
    lengths = seq_lengths(options.points)

    # torch's and sympy's one-time imports and caches, billed to no one: a static and a dynamic
    # analysis of a one-layer GPT (not the model timed, so nothing of its own is cached).
    with torch.device("meta"):
        tiny = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=128))
    idx = torch.zeros(1, 8, dtype=torch.long, device="meta")
    analyze(tiny, (idx,))
    analyze(tiny, (idx,), dynamic_shapes=({1: Dim("seq", max=1024)},))
    sym_times, sym_full, sym_totals = symbolic(lengths)
    concrete_s, concrete_totals = concrete(lengths)
    counter_s, counter_totals = flop_counter(lengths)

    agree = sym_full == sym_totals == concrete_totals == counter_totals
    once = sym_times["analyze once (export and count)"]
    symbolic_full_s = once + sym_times["64 full evaluate()"]
    symbolic_totals_s = once + sym_times["64 total-polynomial evaluations (compiled once)"]
    print(f"torch {torch.__version__}, exportflops {exportflops.__version__}, "
          f"{torch.get_num_threads()} threads, GPT-2 124M on meta, {len(lengths)} sequence "
          f"lengths {lengths[0]}..{lengths[-1]}")
    rows = [
        ("symbolic: " + name, seconds) for name, seconds in sym_times.items()
    ] + [
        ("symbolic, full reports (export, analyze, evaluate)", symbolic_full_s),
        ("symbolic, totals only (export, analyze, polynomial)", symbolic_totals_s),
        ("concrete analyze x64", concrete_s),
        ("FlopCounterMode x64", counter_s),
    ]
    for name, seconds in rows:
        print(f"  {name:<58} {seconds:8.3f} s   FlopCounterMode / this = "
              f"{counter_s / seconds:6.2f}x")
    print(f"  all four ways agree on matmul FLOPs at every length: {agree}")
    speedup, target = counter_s / symbolic_totals_s, len(lengths)
    verdict = "PASS" if speedup >= target and agree else "FAIL"
    print(f"{verdict}: symbolic (totals) is {speedup:.2f}x FlopCounterMode; "
          f"target >= {target}x (the number of points)")
    print(f"  at most {counter_s / target:.3f} s is allowed for {target}x")
    return 0 if verdict == "PASS" else 1


def repeated(points: int, repeat: int) -> int:
    """The comparison in ``repeat`` fresh processes; the verdict on the median ratio, and every
    run's four ways agreeing."""
    ratios, agreed = [], True
    for run in range(repeat):
        output = subprocess.run([sys.executable, __file__, "--points", str(points)],
                                capture_output=True, text=True, check=False).stdout
        verdict = re.search(r"symbolic \(totals\) is ([\d.]+)x", output)
        if verdict is None:
            print(output)
            raise SystemExit(f"run {run + 1} printed no ratio")
        ratios.append(float(verdict[1]))
        agreed = agreed and "at every length: True" in output
        print(f"run {run + 1}: symbolic (totals) {ratios[-1]:.2f}x FlopCounterMode, "
              f"ways agree: {'at every length: True' in output}")
    median = statistics.median(ratios)
    verdict = "PASS" if median >= points and agreed else "FAIL"
    print(f"{verdict}: median of {repeat} runs {median:.2f}x FlopCounterMode "
          f"(runs {min(ratios):.2f}x-{max(ratios):.2f}x); target >= {points}x")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
