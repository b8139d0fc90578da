"""Every model type transformers registers, through the ``hf:`` builder (`exportflops.hf`): built on
meta with at most ``--layers`` layers, then analyzed; counts of built / analyzed / failed-ours /
failed-theirs, and the failing types grouped by error.

A failure is ours (`exportflops.hf.models.blame`) when the innermost frame of its traceback is in
exportflops (our builder, our inputs check, our counting), when transformers' forward read an
input of its own that our builder did not make (a None where it needed a mask or a patch
grid), or when it rejected our inputs with a ValueError of its own; theirs when it is in
transformers or torch otherwise (a constructor that rejects its own default config, a forward
that torch.export cannot capture). A model that meta cannot decide a branch on values for is
built again on cpu where it is small, as the command does (`analyze_deciding_on_cpu`). Each
type runs in a forked child with a time limit.

    python benchmarks/hf_types.py                        # all of CONFIG_MAPPING
    python benchmarks/hf_types.py --every 8 --timeout 60 # one type in eight
    python benchmarks/hf_types.py clip whisper t5        # these types
    python benchmarks/hf_types.py --mode train --every 8 # the backward too (its ops counted)
"""

from __future__ import annotations

import argparse
import collections
import functools
import multiprocessing
import re
import time
import warnings

import torch
import transformers

from exportflops import analyze
from exportflops import hf
from exportflops.hf.models import analyze_deciding_on_cpu, blame


def try_type(model_type: str, layers: int, mode: str, out) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # one core per type: the counts need no parallel kernels
    stage = "build"
    model, args, kwargs = None, (), {}
    try:
        model, args, kwargs = hf.build(model_type, layers=layers)
        stage = "analyze"
        # As hf.analyze does: on cpu where meta cannot decide a branch on values; through the
        # policy it is built on (`analyze_deciding_on_cpu`), so that transformers' failures
        # reach `blame` unwrapped.
        report = analyze_deciding_on_cpu(
            functools.partial(analyze, mode=mode), model, args, kwargs,
            functools.partial(hf.build, model_type, device="cpu", layers=layers))
        out.send(("analyzed", "", sorted(u.op for u in report.uncounted)))
    except Exception as error:
        who = ("ours" if type(error).__name__ == "UsageError"
               else blame(error, model, args, kwargs))
        out.send((f"failed-{who}", f"{stage}: {_short(error)}", []))


def _short(error: BaseException) -> str:
    text = str(error).split("torch said:")[-1].strip().splitlines()
    first = text[0] if text else ""
    # Group alike messages: numbers, quoted names and class names vary per type.
    first = re.sub(r"\d+", "N", first)
    first = re.sub(r"'[^']*'|`[^`]*`|<[^>]*>", "X", first)
    return f"{type(error).__name__}: {first[:110]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("types", nargs="*")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per type")
    parser.add_argument("--every", type=int, default=1, help="every k-th type only")
    parser.add_argument("--mode", choices=["forward", "train"], default="forward")
    ns = parser.parse_args()
    types = ns.types or sorted(transformers.CONFIG_MAPPING.keys())[::ns.every]
    context = multiprocessing.get_context("fork")
    # Warm transformers' and torch.export's lazy imports once in the parent (about 9 s), so that
    # each forked child starts warm.
    warnings.simplefilter("ignore")
    analyze(*hf.build("gpt2", layers=1))
    outcomes = {}
    groups = collections.defaultdict(list)
    started = time.perf_counter()
    for i, model_type in enumerate(types):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=try_type, args=(model_type, ns.layers, ns.mode, send))
        child.start()
        send.close()
        outcome = ("timeout", f"over {ns.timeout:.0f} s", [])
        if receive.poll(ns.timeout):
            try:
                outcome = receive.recv()
            except EOFError:  # the child died without a word: a crash in native code
                outcome = ("failed-theirs", "crashed", [])
        child.kill()
        child.join()
        outcomes[model_type] = outcome
        if outcome[0] != "analyzed":
            groups[(outcome[0], outcome[1])].append(model_type)
        uncounted = f" uncounted: {' '.join(outcome[2])}" if outcome[2] else ""
        print(f"[{i + 1}/{len(types)} {time.perf_counter() - started:.0f}s] {model_type}: "
              f"{outcome[0]} {outcome[1]}{uncounted}", flush=True)
    kinds = collections.Counter(o[0] for o in outcomes.values())
    built = sum(1 for o in outcomes.values()
                if o[0] == "analyzed" or o[1].startswith("analyze:"))
    with_uncounted = sum(1 for o in outcomes.values() if o[0] == "analyzed" and o[2])
    print(f"\ntransformers {transformers.__version__}, torch {torch.__version__}: "
          f"{len(types)} types, {ns.layers} layers, meta, {ns.mode}")
    print(f"built {built}, analyzed {kinds['analyzed']} ({with_uncounted} with uncounted ops), "
          f"failed-ours {kinds['failed-ours']}, failed-theirs {kinds['failed-theirs']}, "
          f"timeout {kinds['timeout']}")
    for (kind, message), names in sorted(groups.items(), key=lambda g: (g[0][0], -len(g[1]))):
        print(f"\n{kind} x{len(names)}: {message}\n  {' '.join(names)}")
    by_op = collections.defaultdict(list)
    for model_type, outcome in outcomes.items():
        for op in outcome[2]:
            by_op[op].append(model_type)
    for op, names in sorted(by_op.items(), key=lambda g: -len(g[1])):
        print(f"\nuncounted {op} x{len(names)}\n  {' '.join(names)}")


if __name__ == "__main__":
    main()
