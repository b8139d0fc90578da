"""What exportflops adds on top of torch.export: export seconds vs the seconds of everything
`analyze()` does after export (walk + count + attribution + aggregate), for GPT-2 124M (seq 1024)
and Llama-3-70B (seq 4096), both on meta.

Target: our part takes at most 5% of the export time.

    python benchmarks/overhead.py [--repeat 3] [--profile]

Export is timed alone (``torch.export.export``); our part is ``analyze(program)`` on the exported
program, which runs analyze's stages after capture through the public API, so this script stays
right when the stages change. (Given a program rather than the module, analyze skips only the
``named_modules()`` walk that names modules which never ran: a few thousand dict inserts.)
One warm-up export of a tiny model first, so that torch's one-time imports and caches are not
billed to the first model's export.

The "gc s" column is the time Python's cyclic garbage collector ran during our part (measured
through ``gc.callbacks``). Export leaves a heap of some 400k objects behind it (fake tensors, fx
nodes, sympy expressions); the objects our stages allocate can trigger full (generation 2)
collections that traverse all of it, so part of that column is export's heap billed to us.

``--profile`` runs cProfile over our part on the last model, with the collector off (a collection
would otherwise be billed to whichever builtin it interrupts), and prints the top functions and
exportflops' own functions by cumulative time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import os
import pstats
import statistics
import time

import torch

import exportflops
from exportflops import analyze
from exportflops.examples.gpt2 import gpt2
from exportflops.examples.llama import LLAMA3_70B, llama

TARGET = 0.05  # our part / export time

MODELS = {
    "GPT-2 124M, T=1024": lambda: gpt2("meta", seq_len=1024),
    "Llama-3-70B, T=4096": lambda: llama("meta", LLAMA3_70B, seq_len=4096),
}


@contextlib.contextmanager
def gc_seconds(into: dict[str, float]):
    """Sets ``into["gc"]`` to the seconds the cyclic collector runs inside the block."""
    started = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            into["gc"] += time.perf_counter() - started.pop()

    into["gc"] = 0.0
    gc.callbacks.append(on_gc)
    try:
        yield into
    finally:
        gc.callbacks.remove(on_gc)


def measure(make, repeat: int) -> dict[str, float]:
    """Medians over ``repeat`` runs: export s, ours s, gc s within ours; and the node count."""
    runs = []
    for _ in range(repeat):
        model, args = make()
        start = time.perf_counter()
        program = torch.export.export(model, args)
        export_s = time.perf_counter() - start
        run: dict[str, float] = {}
        with gc_seconds(run):
            start = time.perf_counter()
            report = analyze(program)
            run["ours"] = time.perf_counter() - start
        runs.append(run | {"export": export_s, "ours without gc": run["ours"] - run["gc"]})
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return median | {"nodes": len(report.nodes)}


def profile(make, top: int = 25) -> None:
    model, args = make()
    program = torch.export.export(model, args)
    profiler = cProfile.Profile()
    gc.disable()
    try:
        profiler.runcall(analyze, program)
    finally:
        gc.enable()
    stats = pstats.Stats(profiler)
    print("exportflops functions by cumulative time (gc off):")
    stats.sort_stats("cumulative").print_stats(f"{os.sep}exportflops{os.sep}", top)
    print("all functions by own time (gc off):")
    stats.strip_dirs().sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per model; medians shown")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile our part on the last model")
    options = parser.parse_args()

    warm_model, warm_args = gpt2("meta", seq_len=8)
    analyze(torch.export.export(warm_model, warm_args))

    print(f"torch {torch.__version__}, exportflops {exportflops.__version__}, "
          f"{torch.get_num_threads()} threads, median of {options.repeat} runs")
    print(f"{'model':<22} {'nodes':>6} {'export s':>9} {'ours s':>7} {'ours/export':>12} "
          f"{'gc s':>6} {'(ours-gc)/export':>17}")
    passed = True
    for name, make in MODELS.items():
        m = measure(make, options.repeat)
        ratio = m["ours"] / m["export"]
        passed &= ratio <= TARGET
        print(f"{name:<22} {m['nodes']:>6} {m['export']:>9.3f} {m['ours']:>7.3f} "
              f"{ratio:>12.1%} {m['gc']:>6.3f} {m['ours without gc'] / m['export']:>17.1%}")
    verdict = "PASS" if passed else "FAIL"
    print(f"{verdict}: target walk + count + attribution + aggregate <= {TARGET:.0%} of export")

    if options.profile:
        name, make = list(MODELS.items())[-1]
        print(f"\ncProfile, {name}")
        profile(make)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
