"""One analysis against one ``torch.utils.flop_counter.FlopCounterMode`` run, both on meta, in
one process: GPT-2 124M at 1024 tokens, a Llama-3-70B shape at 4096 tokens and, with
``--405b``, a Llama-3.1-405B shape at 4096 tokens.

Target: ``analyze(model, args)`` (the fast path, the default) takes at most 2x the time of
running the model's forward once under FlopCounterMode. The two alternate, ``--repeat`` times
each (default 3), and the medians are compared; ``analyze(..., fast=False)`` (the full export)
is timed the same way for reference. One warm-up of each on a tiny model first, so torch's
one-time imports and caches are billed to neither.

    python benchmarks/oneshot.py [--repeat 3] [--no-full] [--405b]
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

TARGET = 2.0  # analyze seconds / FlopCounterMode seconds

MODELS = {
    "GPT-2 124M, T=1024": lambda: gpt2("meta", seq_len=1024),
    "Llama-3-70B, T=4096": lambda: llama("meta", LLAMA3_70B, seq_len=4096),
}
LARGEST = {"Llama-3.1-405B, T=4096": lambda: llama("meta", LLAMA3_405B, seq_len=4096)}


def flop_counter(model: torch.nn.Module, args: tuple) -> float:
    start = time.perf_counter()
    with FlopCounterMode(display=False):
        model(*args)
    return time.perf_counter() - start


def ours(model: torch.nn.Module, args: tuple, fast: bool) -> float:
    start = time.perf_counter()
    analyze(model, args, fast=fast)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="skip timing fast=False")
    parser.add_argument("--405b", dest="largest", action="store_true",
                        help="also the Llama-3.1-405B shape")
    options = parser.parse_args()
    print(f"torch {torch.__version__}, exportflops {exportflops.__version__}, "
          f"medians of {options.repeat}, meta device")
    warm_model, warm_args = gpt2("meta", seq_len=16)
    flop_counter(warm_model, warm_args)
    ours(warm_model, warm_args, fast=True)
    ours(warm_model, warm_args, fast=False)
    rows = []
    for name, build in (MODELS | (LARGEST if options.largest else {})).items():
        model, args = build()
        times: dict[str, list[float]] = {"FlopCounterMode": [], "fast": [], "full": []}
        for _ in range(options.repeat):
            times["FlopCounterMode"].append(flop_counter(model, args))
            times["fast"].append(ours(model, args, fast=True))
            if not options.no_full:
                times["full"].append(ours(model, args, fast=False))
        medians = {key: statistics.median(value) for key, value in times.items() if value}
        rows.append((name, medians))
    print(f"{'model':<24}{'FlopCounterMode s':>18}{'fast s':>9}{'ratio':>8}"
          f"{'full s':>9}{'ratio':>8}   target <= {TARGET:g}x")
    for name, medians in rows:
        base = medians["FlopCounterMode"]
        full = medians.get("full")
        tail = f"{full:>9.3f}{full / base:>7.2f}x" if full is not None else ""
        verdict = "met" if medians["fast"] / base <= TARGET else "missed"
        print(f"{name:<24}{base:>18.3f}{medians['fast']:>9.3f}{medians['fast'] / base:>7.2f}x"
              f"{tail}   {verdict}")


if __name__ == "__main__":
    main()
