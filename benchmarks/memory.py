"""The predicted peak of a step (`exportflops.memory`) against torch's profiler on a real cpu
step, per model: the models of tests/footprint (GPT-2's shape, a 4-layer Llama, a 2-layer
Mixtral, a ResNet's shape with batch norm, an MLP under activation checkpointing), train with
AdamW and forward.

Target (issue 50): predicted / measured within 0.97 .. 1.03. Also printed: the seconds of the
memory analysis and of the FLOPs analysis (``analyze``) of the same mode.

    python benchmarks/memory.py
    python benchmarks/memory.py --llama3-70b [--repeat 3]   # and both analyses of Llama 3 70B

On Llama 3 70B the two analyses alternate ``--repeat`` times and the process's CPU seconds are
taken (other processes share the machine); the medians and their ratio are printed.

Issue 50's bar for the second: on meta, 4096 tokens, train, the memory analysis at most 2x the
FLOPs analysis (Llama 3 70B: 80 layers, width 8192, MLP 28672, 64 heads and 8 KV heads,
vocabulary 128256, from Meta's config.json of Meta-Llama-3-70B).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' models and profiler

import exportflops  # noqa: E402
from tests.footprint.models import CASES  # noqa: E402
from tests.footprint.profiled import forward_step, profiled, training_step  # noqa: E402


def seconds(call) -> tuple[object, float]:
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def main() -> None:
    print(f"{'model':26} {'mode':8} {'predicted B':>12} {'measured B':>12} {'ratio':>6} "
          f"{'memory s':>9} {'flops s':>8}")
    for name, case in CASES.items():
        for mode in ("train", "forward"):
            model, args, kwargs = case.build()
            if mode == "forward":
                kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
            report, memory_s = seconds(lambda: exportflops.memory(
                model, args, kwargs, mode=mode, loss=case.loss))
            _, flops_s = seconds(lambda: exportflops.analyze(model, args, kwargs, mode=mode))
            step = (training_step(model, lambda: case.loss(model(*args, **kwargs)))
                    if mode == "train" else forward_step(model, *args, **kwargs))
            measured = profiled(step).peak_bytes
            print(f"{name:26} {mode:8} {report.peak_bytes:12d} {measured:12d} "
                  f"{report.peak_bytes / measured:6.3f} {memory_s:9.2f} {flops_s:8.2f}")


def llama3_70b(repeat: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                         max_position_embeddings=8192, rope_theta=500000.0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        ids = torch.zeros(1, 4096, dtype=torch.long)
    kwargs = {"input_ids": ids, "labels": ids}
    memory_s, flops_s = [], []
    for _ in range(repeat):
        start = time.process_time()
        report = exportflops.memory(model, (), kwargs)
        memory_s.append(time.process_time() - start)
        start = time.process_time()
        exportflops.analyze(model, (), kwargs, mode="train")
        flops_s.append(time.process_time() - start)
    memory, flops = statistics.median(memory_s), statistics.median(flops_s)
    print(f"Llama 3 70B shape, train, 4096 tokens on meta: peak {report.peak_bytes} B; CPU "
          f"seconds, median of {repeat}: memory {memory:.1f}, flops {flops:.1f}, ratio "
          f"{memory / flops:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama3-70b", action="store_true",
                        help="also time both analyses on Llama 3 70B's shape")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    main()
    if options.llama3_70b:
        llama3_70b(options.repeat)
