"""One analysis against one ``torch.utils.flop_counter.FlopCounterMode`` run, both on meta, in
one process: GPT-2 124M at 1024 tokens, a Llama-3-70B shape at 4096 tokens and, with
``--405b``, a Llama-3.1-405B shape at 4096 tokens.

Target (issue 53): ``analyze(model, args)`` (the fast path, the default) takes at most the
time of running the model's forward once under FlopCounterMode for GPT-2, at most half of it
for the Llama shapes. The two alternate, ``--repeat`` times each (default 3), and the
medians are compared (``--cpu``: the process's CPU time, and the fastest of the runs, on a
machine other processes share); ``analyze(..., fast=False)`` (the full export) is timed the
same way for reference. One warm-up of each on a tiny model first, so torch's one-time
imports and caches are billed to neither.

    python benchmarks/oneshot.py [--repeat 3] [--no-full] [--405b] [--cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import exportflops
from exportflops import analyze
from exportflops.examples.gpt2 import gpt2
from exportflops.examples.llama import LLAMA3_70B, LLAMA3_405B, llama

#: analyze seconds / FlopCounterMode seconds, per model (issue 53)
TARGET = {"GPT-2 124M, T=1024": 1.0}
DEEP_TARGET = 0.5  # the Llama shapes: 80 and 126 blocks

MODELS = {
    "GPT-2 124M, T=1024": lambda: gpt2("meta", seq_len=1024),
    "Llama-3-70B, T=4096": lambda: llama("meta", LLAMA3_70B, seq_len=4096),
}
LARGEST = {"Llama-3.1-405B, T=4096": lambda: llama("meta", LLAMA3_405B, seq_len=4096)}


def flop_counter(model: torch.nn.Module, args: tuple, clock=time.perf_counter) -> float:
    start = clock()
    with FlopCounterMode(display=False):
        model(*args)
    return clock() - start


def ours(model: torch.nn.Module, args: tuple, fast: bool, clock=time.perf_counter) -> float:
    start = clock()
    analyze(model, args, fast=fast)
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="skip timing fast=False")
    parser.add_argument("--405b", dest="largest", action="store_true",
                        help="also the Llama-3.1-405B shape")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU seconds of this process, fastest run (a shared machine)")
    options = parser.parse_args()
    clock = time.process_time if options.cpu else time.perf_counter
    summary = min if options.cpu else statistics.median
    print(f"torch {torch.__version__}, exportflops {exportflops.__version__}, "
          f"{summary.__name__}s of {options.repeat}, {'CPU' if options.cpu else 'wall'} "
          f"time, meta device")
    warm_model, warm_args = gpt2("meta", seq_len=16)
    flop_counter(warm_model, warm_args)
    ours(warm_model, warm_args, fast=True)
    ours(warm_model, warm_args, fast=False)
    rows = []
    for name, build in (MODELS | (LARGEST if options.largest else {})).items():
        model, args = build()
        times: dict[str, list[float]] = {"FlopCounterMode": [], "fast": [], "full": []}
        for _ in range(options.repeat):
            times["FlopCounterMode"].append(flop_counter(model, args, clock))
            times["fast"].append(ours(model, args, True, clock))
            if not options.no_full:
                times["full"].append(ours(model, args, False, clock))
        medians = {key: summary(value) for key, value in times.items() if value}
        rows.append((name, medians))
    print(f"{'model':<24}{'FlopCounterMode s':>18}{'fast s':>9}{'ratio':>8}"
          f"{'full s':>9}{'ratio':>8}   target")
    for name, medians in rows:
        base = medians["FlopCounterMode"]
        full = medians.get("full")
        tail = f"{full:>9.3f}{full / base:>7.2f}x" if full is not None else ""
        target = TARGET.get(name, DEEP_TARGET)
        verdict = f"<= {target:g}x " + ("met" if medians["fast"] / base <= target else "missed")
        print(f"{name:<24}{base:>18.3f}{medians['fast']:>9.3f}{medians['fast'] / base:>7.2f}x"
              f"{tail}   {verdict}")


if __name__ == "__main__":
    main()
