"""What counting a training step's FLOPs costs per step: ``fpb(batch)`` vs FlopCounterMode.

Lightning's ``measure_flops`` and DeepSpeed's profiler count by running the step under a
dispatch mode; `exportflops.flops_per_batch` analyzes once and then evaluates polynomials in the
batch's sizes. This script times, in one run on this machine, for a GPT-2-shaped model
(transformers' GPT2LMHeadModel, 4 layers, 256 wide, trained on its language-model loss, cpu):

- the step alone (forward, backward);
- the same step under ``torch.utils.flop_counter.FlopCounterMode`` (what a per-step count with
  it costs, and its overhead over the step);
- ``fpb(batch)`` and ``fpb.step(batch)`` per call (microseconds), and the one-time analysis;
- ``fpb(**batch)`` per call for the same batch with an ``attention_mask`` padding one row, in
  a second analysis of the example with a mask (the mask is read: one sum and one copy).

Targets: ``fpb(batch)`` at least 1000x cheaper per step than the step under FlopCounterMode;
``fpb(**batch)`` with a mask within 30 us per call.
It also checks the counts agree: FlopCounterMode's matmul FLOPs equal ``StepFlops.matmul_flops``
(its convention: contractions only, 2 per MAC).

    python benchmarks/flops_per_batch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import exportflops
from timing import median_seconds
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, SEQ = 4, 256



def _cpu_seconds(function, repeat: int) -> float:
    """The fewest of ``repeat`` measures of this process's CPU seconds in ``function()``."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        function()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    ns = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=SEQ, vocab_size=8192, n_layer=4, n_head=4,
                                       n_embd=256, use_cache=False))
    idx = torch.randint(0, 8192, (BATCH, SEQ))
    batch = {"input_ids": idx, "labels": idx}

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    def counted_step():
        with FlopCounterMode(display=False) as counter:
            step()
        return counter.get_total_flops()

    step()  # warm-up
    plain = median_seconds(step, ns.repeat)
    under_counter = median_seconds(counted_step, ns.repeat)
    start = time.perf_counter()
    fpb = exportflops.flops_per_batch(model, (), batch)
    analysis = time.perf_counter() - start
    calls = 2000
    per_call = median_seconds(lambda: [fpb(**batch) for _ in range(calls)], ns.repeat) / calls
    per_step_record = median_seconds(lambda: [fpb.step(**batch) for _ in range(200)],
                               ns.repeat) / 200
    masked = {**batch, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}
    fpb_masked = exportflops.flops_per_batch(model, (), masked)
    masked["attention_mask"][0, SEQ // 2:] = 0  # one row half padding: rows of two lengths
    per_masked_call = median_seconds(lambda: [fpb_masked(**masked) for _ in range(calls)],
                                     ns.repeat) / calls
    # This process's CPU time per call: on a machine other jobs share, wall time also counts
    # theirs.
    cpu_plain, cpu_masked = (
        _cpu_seconds(lambda: [count(**inputs) for _ in range(calls)], ns.repeat) / calls
        for count, inputs in ((fpb, batch), (fpb_masked, masked)))
    matmul = fpb.step(**batch).matmul_flops
    theirs = counted_step()
    print(f"GPT-2-shaped (4 layers, 256 wide, vocab 8192), batch {BATCH} x seq {SEQ}, cpu, "
          f"torch {torch.__version__}, median of {ns.repeat}")
    print(f"  step alone                      {plain * 1e3:10.2f} ms")
    print(f"  step under FlopCounterMode      {under_counter * 1e3:10.2f} ms "
          f"(overhead {(under_counter - plain) * 1e3:.2f} ms)")
    print(f"  flops_per_batch analysis, once  {analysis:10.2f} s")
    print(f"  fpb(batch) per call             {per_call * 1e6:10.2f} us")
    print(f"  fpb.step(batch) per call        {per_step_record * 1e6:10.2f} us")
    print(f"  fpb(**batch) with a mask, call  {per_masked_call * 1e6:10.2f} us (target <= 30 us)")
    print(f"  the same, this process's cpu    {cpu_plain * 1e6:10.2f} us without a mask, "
          f"{cpu_masked * 1e6:.2f} us with")
    print(f"  FlopCounterMode step / fpb call {under_counter / per_call:10.0f}x "
          f"(target >= 1000x); its overhead alone / fpb call "
          f"{max(under_counter - plain, 0) / per_call:.0f}x")
    print(f"  matmul FLOPs: ours {matmul}, FlopCounterMode {theirs}: "
          f"{'equal' if matmul == theirs else 'DIFFER'}")


if __name__ == "__main__":
    main()
