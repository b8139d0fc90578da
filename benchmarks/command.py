"""The command's wall time beside its floor, and where it goes, for three models: ``exportflops
hf:llama --layers 2``, ``hf:qwen2_moe --layers 2`` and ``gpt2`` (the built-in GPT-2 124M).

The floor is a bare script doing the same work in one process: its imports (torch,
exportflops, and transformers for hf:), the config, the same model class built on meta at the
same depth (the KV cache off, as the command turns it off), ``exportflops.analyze`` of it on
the same inputs (128 tokens for hf:, the example's 1,024 for gpt2). Target (issue 53): the
command within 1.3x of its floor; the script exits 1 past it.

    python benchmarks/command.py [--repeat 3] [MODEL ...]

Each run is a fresh interpreter, as a user's is; the command and its floor alternate, so that
a load from elsewhere on the machine weighs on both alike, and each time is the median of
``--repeat`` runs. The command runs with ``--progress``, whose stage lines (`exportflops.cli`)
are read as they come: "start" is the interpreter, torch and exportflops up to the first
line; "imports" transformers' (hf: only); "build", "export" (torch.export's capture),
"count" and "render" are the command's own stages, the last up to the report's first bytes on
stdout; "exit" from then to the end of the process (writing the report, the interpreter's
teardown). The floor reports its own three parts likewise. "cpu" is each process's user and
system seconds: a load from elsewhere stretches the wall times, much less these, so their
ratio is printed beside (the target is on the wall time, what the user waits).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

TARGET = 1.3  # the command's wall time over its floor's

#: Each MODEL: the command's arguments, and its floor, what the bare script builds (the model
#: type and layers of an hf: config, or the built-in example).
CASES = {
    "hf:llama": (["--layers", "2"], {"hf": "llama", "layers": 2}),
    "hf:qwen2_moe": (["--layers", "2"], {"hf": "qwen2_moe", "layers": 2}),
    "gpt2": ([], {"example": "gpt2"}),
}

# The floor: one process, the parts timed in it, printed as JSON on its last line.
BARE = """
import json, sys, time
start = time.perf_counter()
case = json.loads(sys.argv[1])
import torch
import exportflops
if "hf" in case:  # the built-in examples need no transformers, and the command imports none
    import transformers
imported = time.perf_counter()
if "hf" in case:
    config = transformers.AutoConfig.for_model(case["hf"], num_hidden_layers=case["layers"],
                                               use_cache=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    args = (torch.zeros(1, 128, dtype=torch.long, device="meta"),)
else:
    from exportflops.examples import EXAMPLES
    model, args = EXAMPLES[case["example"]](device=torch.device("meta"))
built = time.perf_counter()
exportflops.analyze(model, args)
done = time.perf_counter()
print(json.dumps({"model": type(model).__name__, "imports": imported - start,
                  "build": built - imported, "analyze": done - built}))
"""

STAGE = re.compile(r"exportflops: (\w+) \(")


def timed_command(argv: list[str]) -> tuple[float, dict[str, float], str]:
    """(wall seconds, seconds per stage, the model the report names) of ``exportflops ARGV
    --progress`` in a fresh interpreter."""
    marks: list[tuple[str, float]] = []  # (stage, when it began)
    out: list[tuple[float, str]] = []
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "exportflops", *argv, "--progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stderr() -> None:
        for line in child.stderr:
            found = STAGE.match(line)
            if found:
                marks.append((found[1], time.perf_counter() - start))

    def stdout() -> None:
        first = child.stdout.readline()
        out.append((time.perf_counter() - start, first + child.stdout.read()))

    readers = [threading.Thread(target=reader) for reader in (stderr, stdout)]
    for reader in readers:
        reader.start()
    code, cpu = _reaped(child)
    wall = time.perf_counter() - start
    for reader in readers:
        reader.join()
    if code != 0 or not out:
        raise SystemExit(f"exportflops {' '.join(argv)} exited {code}")
    written, text = out[0]
    ends = [when for _, when in marks[1:]] + [written]
    stages = {"start": marks[0][1] if marks else written}
    stages |= {name: end - began for (name, began), end in zip(marks, ends)}
    stages["exit"] = wall - written
    summary = re.search(r"Summary of (\w+)", text)
    return wall, stages | {"cpu": cpu}, summary[1] if summary else "?"


def timed_floor(case: dict) -> tuple[float, dict[str, float], str]:
    """(wall seconds, seconds per part, the model it built) of the bare script on ``case``."""
    start = time.perf_counter()
    # Its warnings come before the JSON line, which is its last.
    child = subprocess.Popen([sys.executable, "-c", BARE, json.dumps(case)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = child.stdout.read()
    code, cpu = _reaped(child)
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"the floor of {case} exited {code}:\n{out[-2000:]}")
    parts = json.loads(out.strip().splitlines()[-1])
    return wall, {k: v for k, v in parts.items() if k != "model"} | {"cpu": cpu}, parts["model"]


def _reaped(child: subprocess.Popen) -> tuple[int, float]:
    """(exit status, cpu seconds, user and system) of ``child`` once it ends: the cpu seconds
    weigh little of another load on the machine, which stretches the wall time of both."""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_utime + usage.ru_stime


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(run.get(name, 0.0) for run in runs) for name in runs[0]}


def measure(argv: list[str], case: dict, repeat: int) -> float:
    """Print the command's and the floor's medians, each part, and their ratio; the ratio."""
    command = " ".join(argv)
    commands, floors = [], []
    for _ in range(repeat):
        commands.append(timed_command(argv))
        floors.append(timed_floor(case))
    model, floor_model = commands[0][2], floors[0][2]
    if model != floor_model:  # not the same work: the ratio would mean nothing
        raise SystemExit(f"{command} analyzes {model}, its floor {floor_model}")
    wall = statistics.median(run[0] for run in commands)
    floor = statistics.median(run[0] for run in floors)
    print(f"exportflops {command}  ({model}; median of {repeat})")
    print(f"  command {wall:6.2f} s   " + "  ".join(
        f"{name} {seconds:.2f}" for name, seconds in medians([r[1] for r in commands]).items()))
    print(f"  floor   {floor:6.2f} s   " + "  ".join(
        f"{name} {seconds:.2f}" for name, seconds in medians([r[1] for r in floors]).items()))
    cpu = [statistics.median(run[1]["cpu"] for run in runs) for runs in (commands, floors)]
    print(f"  ratio   {wall / floor:6.2f}   (target <= {TARGET}; of cpu seconds "
          f"{cpu[0] / cpu[1]:.2f})")
    return wall / floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"the cases to run (default all: {', '.join(CASES)})")
    parser.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    unknown = sorted(set(ns.models) - set(CASES))
    if unknown:
        parser.error(f"no case {unknown[0]}; the cases: {', '.join(CASES)}")
    ratios = {model: measure([model, *CASES[model][0]], CASES[model][1], ns.repeat)
              for model in ns.models or CASES}
    over = [model for model, ratio in ratios.items() if ratio > TARGET]
    if over:
        raise SystemExit(f"past {TARGET}x of the floor: {', '.join(over)}")


if __name__ == "__main__":
    main()
