"""GPU truth, prepared: everything a CUDA machine should check, in one run of a few minutes.

1. the tests that need CUDA (those whose skip reason says so), through pytest;
2. GPT-2 124M (bfloat16) and a Llama-shaped model (float32, TF32 matmuls) profiled with
   `exportflops.profile`, no grad: per-module latency, achieved FLOP/s and MFU;
3. a small Llama trained a few steps under bfloat16 autocast with the plain-loop helper
   (`StepTimer`, `dense_peak`): its MFU from the exact per-batch count (and its matmul part)
   beside the MFU of torchtitan's formula;
4. the roofline's predicted time (`exportflops.roofline`) against the measured one, per op,
   with the error;
5. the predicted peak of a training step (`exportflops.memory`, ``allocator="cuda"``) of
   GPT-2 124M and a Llama-shaped model against ``torch.cuda.max_memory_allocated`` of the real
   step, the ratio per model.

Without CUDA it prints "no CUDA: skipped" and exits 0. ``--cpu-dry-run`` runs every part on
the CPU with tiny models (the tests are only collected; part 5 predicts only), so that the
script is known to work before a GPU runs it; its figures mean nothing. On an H100 the whole
run takes about 5 minutes, most of it the exports.

    python benchmarks/gpu.py [--cpu-dry-run] [--skip-tests]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import exportflops
from exportflops.errors import UnknownDeviceError
from exportflops.examples.gpt2 import GPT, GPTConfig
from exportflops.examples.llama import Llama, LlamaConfig
from exportflops.records import Report
from exportflops.render import flops_report
from exportflops import device_table
from exportflops.roofline import devices, roofline
from exportflops.training import flops_per_batch
from exportflops.training.throughput import DensePeak, StepTimer, dense_peak

ROOT = Path(__file__).resolve().parent.parent

#: torchtitan's MFU count, ``get_num_flop_per_token`` (later releases moved it to
#: torchtitan/models/utils.py).
TORCHTITAN_SOURCE = ("https://github.com/pytorch/torchtitan/blob/main/torchtitan/utils.py "
                     "(get_num_flop_per_token)")


#: GPT-2 is profiled with bfloat16 weights. The example Llama computes its rotary angles in
#: float32 (``examples/llama.py``), so with bfloat16 weights its queries and keys come out float32
#: and SDPA refuses the mixed dtypes: it is profiled in float32 with TF32 matmuls (and its MFU
#: taken against the TF32 peak), and trained under bfloat16 autocast, as mixed precision trains.
GPT_DTYPE, LLAMA_PROFILE_PRECISION, TRAIN_AUTOCAST = torch.bfloat16, "high", torch.bfloat16


@dataclass(frozen=True)
class Plan:
    """The sizes of one run: the GPU's, or the dry run's tiny ones."""

    device: str
    gpt: GPTConfig
    llama: LlamaConfig
    profile_batch: int
    profile_seq: int
    train: LlamaConfig
    train_batch: int
    train_seq: int
    warmup: int
    repeat: int


GPU_PLAN = Plan(
    device="cuda", gpt=GPTConfig(),
    # Llama-shaped at 1B scale: 16 layers of width 2048, 32 heads of 64, 8 key/value heads.
    llama=LlamaConfig(vocab_size=32000, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                      head_dim=64, ffn_dim=5632, max_seq_len=4096),
    profile_batch=8, profile_seq=1024,
    train=LlamaConfig(vocab_size=32000, dim=2048, n_layers=8, n_heads=16, n_kv_heads=8,
                      head_dim=128, ffn_dim=5632, max_seq_len=4096),
    train_batch=4, train_seq=2048, warmup=5, repeat=20)

CPU_PLAN = Plan(
    device="cpu",
    gpt=GPTConfig(block_size=64, vocab_size=96, n_layer=2, n_head=2, n_embd=32),
    llama=LlamaConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                      ffn_dim=64, max_seq_len=64),
    profile_batch=2, profile_seq=16,
    train=LlamaConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                      ffn_dim=64, max_seq_len=64),
    train_batch=2, train_seq=16, warmup=1, repeat=3)


# --- 1. the CUDA tests --------------------------------------------------------------------------

def needs_cuda(item) -> bool:
    """A test needs CUDA when one of its skip conditions says so in its reason."""
    return any("needs a cuda" in str(mark.kwargs.get("reason", "")).lower()
               for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items) -> None:
    """pytest's hook, when this file runs as a plugin (``-p benchmarks.gpu``): the CUDA tests
    only."""
    kept = [item for item in items if needs_cuda(item)]
    config.hook.pytest_deselected(items=[item for item in items if not needs_cuda(item)])
    items[:] = kept


def cuda_test_files() -> list[str]:
    """The test files that mention CUDA (the others cannot hold a test that needs it)."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                  if "cuda" in path.read_text())


def run_cuda_tests(collect_only: bool) -> int:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.gpu", "-p",
               "no:cacheprovider", *(["--collect-only"] if collect_only else []),
               *cuda_test_files()]
    print("$", " ".join(command[2:]), flush=True)
    return subprocess.run(command, cwd=ROOT, timeout=300).returncode


# --- 2. profiles ---------------------------------------------------------------------------------

def profile_model(name: str, model: torch.nn.Module, tokens: torch.Tensor, plan: Plan,
                  peak: DensePeak) -> Report:
    with torch.no_grad():
        # The table's row is looked up by `profile` itself (None); False where it has none.
        report = exportflops.profile(model.eval(), (tokens,), device=plan.device,
                                     warmup=plan.warmup, repeat=plan.repeat,
                                     peak_flop_per_s=None if peak.flop_per_s else False)
    runtime = report.runtime
    weights = next(model.parameters()).dtype
    print(f"\n## {name}: batch {tuple(tokens.shape)}, {weights} weights, float32 matmul "
          f"precision {torch.get_float32_matmul_precision()!r}, {runtime.device}")
    print(flops_report(report, view=("tree",), depth=2))
    mfu = "n/a" if runtime.mfu is None else f"{runtime.mfu:.1%}"
    print(f"plain forward {runtime.plain_total.median_s * 1e3:.2f} ms (median of "
          f"{runtime.repeat}), {runtime.achieved_flop_per_s / 1e12:.2f} TFLOP/s, MFU {mfu} "
          f"against {runtime.peak_source or 'no peak'}")
    return report


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def profiles(plan: Plan, peak: DensePeak) -> list[tuple[str, Report, bool]]:
    """Each model's name, its profiled report, and whether its float32 matmuls ran as TF32."""
    torch.manual_seed(0)
    with torch.device(plan.device):
        gpt = GPT(plan.gpt).to(GPT_DTYPE)
        llama = Llama(plan.llama)
        gpt_tokens = torch.randint(0, plan.gpt.vocab_size, (plan.profile_batch, plan.profile_seq))
        llama_tokens = torch.randint(0, plan.llama.vocab_size,
                                     (plan.profile_batch, plan.profile_seq))
    gpt_name = "GPT-2 124M" if plan.gpt == GPTConfig() else "GPT-2 (tiny)"
    reports = [(gpt_name, profile_model(gpt_name, gpt, gpt_tokens, plan, peak), False)]
    tf32 = plan.device == "cuda" and LLAMA_PROFILE_PRECISION != "highest"  # the CPU has none
    with float32_matmul_precision(LLAMA_PROFILE_PRECISION):
        reports.append(("Llama-shaped", profile_model("Llama-shaped", llama, llama_tokens, plan,
                                                      peak), tf32))
    return reports


# --- 3. a few training steps, MFU beside torchtitan's -------------------------------------------

def torchtitan_flops_per_token(model: Llama, config: LlamaConfig, seq: int) -> int:
    """torchtitan's count (see TORCHTITAN_SOURCE), step by step:

    1. N = the parameters less the token embedding's (``get_num_params(model,
       exclude_embedding=True)``): norms' weights included, the output projection too;
    2. 6 N: each parameter's multiply-add is 2 FLOPs forward and 4 backward;
    3. 12 L H Q T: per layer the two attention matmuls (scores, values), forward 2 and backward
       4, at 2 FLOPs per multiply-add, over T positions, Q = dim // n_heads; the causal mask's
       skipped half is counted, and flash attention's recompute is not.
    """
    params = sum(p.numel() for p in model.parameters())
    params -= model.tok_embeddings.weight.numel()
    head = config.dim // config.n_heads
    return 6 * params + 12 * config.n_layers * config.n_heads * head * seq


def train_steps(plan: Plan, peak: DensePeak) -> dict[str, float]:
    torch.manual_seed(0)
    with torch.device(plan.device):
        model = Llama(plan.train).train()
        tokens = torch.randint(0, plan.train.vocab_size, (plan.train_batch, plan.train_seq + 1))
    # Copies, not views: a view of a wider tensor has strides the export would specialize on.
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    fpb = flops_per_batch(model, (inputs,))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timer, seconds = StepTimer(), []
    for step in range(plan.warmup + plan.repeat):
        with timer:
            with torch.autocast(plan.device, dtype=TRAIN_AUTOCAST):
                logits = model(inputs)  # (B, T, vocab)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step >= plan.warmup:
            seconds.append(timer.seconds)
    median = statistics.median(seconds)
    step = fpb.step(inputs)
    titan_flops = torchtitan_flops_per_token(model, plan.train, plan.train_seq) * inputs.numel()
    rates = {"exportflops (exact, per batch)": peak.throughput(step.model_flops, median),
             "  of which matmuls": peak.throughput(step.matmul_flops, median),
             "torchtitan 6N + 12LHQT": peak.throughput(titan_flops, median)}
    print(f"\n## training {plan.train_batch} x {plan.train_seq} tokens, {TRAIN_AUTOCAST} "
          f"autocast, "
          f"{plan.repeat} steps after {plan.warmup} warm-up: median {median * 1e3:.2f} ms/step "
          f"(the loss, outside the model, is not counted)")
    print(f"{'count':<34} {'FLOPs/step':>16} {'TFLOP/s':>10} {'MFU':>8}")
    for label, rate in rates.items():
        mfu = "n/a" if rate.mfu is None else f"{rate.mfu:.2%}"
        print(f"{label:<34} {rate.flops:>16,} {rate.achieved_flop_per_s / 1e12:>10.2f} "
              f"{mfu:>8}")
    print(f"exact / torchtitan: {step.model_flops / titan_flops:.4f}; peak: {peak.source}; "
          f"torchtitan: {TORCHTITAN_SOURCE}")
    return {"model_flops": step.model_flops, "matmul_flops": step.matmul_flops,
            "torchtitan_flops": titan_flops, "seconds": median}


# --- 4. the roofline's prediction against the measurement ---------------------------------------

def predicted_against_measured(report: Report, device_key: str,
                               tf32: bool) -> dict[str, tuple[float, float]]:
    """Per op: (predicted seconds, measured seconds), summed over the nodes measured."""
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for node in roofline(report, device_key, tf32=tf32).nodes:
        if node.measured_s is not None:
            by_op[node.op][0] += node.predicted_s
            by_op[node.op][1] += node.measured_s
    return {op: (predicted, measured) for op, (predicted, measured) in by_op.items()}


def print_roofline(name: str, report: Report, device_key: str, tf32: bool) -> None:
    rows = predicted_against_measured(report, device_key, tf32)
    print(f"\n## roofline on {device_key}{' (TF32)' if tf32 else ''} vs measured: {name}")
    print(f"{'op':<52} {'predicted ms':>13} {'measured ms':>12} {'error':>9}")
    for op, (predicted, measured) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        error = f"{predicted / measured - 1:+.0%}" if measured > 0 else "n/a"
        print(f"{op:<52} {predicted * 1e3:>13.4f} {measured * 1e3:>12.4f} {error:>9}")
    predicted, measured = (sum(column) for column in zip(*rows.values()))
    print(f"{'all timed ops':<52} {predicted * 1e3:>13.4f} {measured * 1e3:>12.4f} "
          f"{predicted / measured - 1:>+9.0%}")


# --- 5. the predicted peak of a training step against the allocator's -------------------------
# transformers' models, float32, their loss from the labels. What the prediction leaves out by
# definition (docs/memory.md) shows in the ratio: cuBLAS's workspace (taken from the caching
# allocator at the first matmul and kept), and the CUDA attention kernels' saved tensors where
# they differ from those of the cpu kernels the fake step runs.

@dataclass(frozen=True)
class MemoryCase:
    name: str
    build: Callable[[], torch.nn.Module]
    """The model, on the current default device."""
    batch: int
    seq: int


def _gpt2(tiny: bool) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = (GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64,
                             bos_token_id=0, eos_token_id=0)
                  if tiny else GPT2Config())  # the default: GPT-2 124M, vocab 50257
        return GPT2LMHeadModel(config)
    return build


def _llama(tiny: bool) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        # Llama-shaped: 8 layers of width 2048, 16 heads of 128, 8 key/value heads.
        sizes = (dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2) if tiny else
                 dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8))
        return LlamaForCausalLM(LlamaConfig(max_position_embeddings=4096, **sizes))
    return build


def memory_cases(tiny: bool) -> list[MemoryCase]:
    return [MemoryCase("GPT-2 124M" if not tiny else "GPT-2 (tiny)", _gpt2(tiny),
                       2 if tiny else 8, 16 if tiny else 1024),
            MemoryCase("Llama-shaped" if not tiny else "Llama (tiny)", _llama(tiny),
                       2 if tiny else 2, 16 if tiny else 2048)]


def _inputs(model: torch.nn.Module, case: MemoryCase, device: str) -> dict:
    tokens = torch.randint(0, model.config.vocab_size, (case.batch, case.seq), device=device)
    return {"input_ids": tokens, "labels": tokens}


def allocated_peak(case: MemoryCase) -> tuple[int, int]:
    """(the predicted peak in CUDA blocks, ``max_memory_allocated`` over the real step 2 less
    what was allocated before the model)."""
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = case.build()
    inputs = _inputs(model, case, "cuda")
    predicted = exportflops.memory(model, kwargs=inputs, allocator="cuda").peak_bytes
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return predicted, torch.cuda.max_memory_allocated() - before


def predicted_on_meta(case: MemoryCase) -> int:
    with torch.device("meta"):
        model = case.build()
    return exportflops.memory(model, kwargs=_inputs(model, case, "meta"),
                              allocator="cuda").peak_bytes


def print_memory(on_cuda: bool) -> dict[str, tuple[int, int | None]]:
    """Each model's (predicted, measured or None on the dry run) peak, printed with the
    ratio."""
    print("\n## memory of a training step (AdamW, float32, step 2): predicted "
          "(allocator='cuda') vs torch.cuda.max_memory_allocated")
    print(f"{'model':<16} {'tokens':>10} {'predicted':>14} {'measured':>14} {'ratio':>7}")
    rows: dict[str, tuple[int, int | None]] = {}
    for case in memory_cases(tiny=not on_cuda):
        predicted, measured = allocated_peak(case) if on_cuda else (predicted_on_meta(case),
                                                                    None)
        rows[case.name] = (predicted, measured)
        ratio = f"{predicted / measured:.3f}" if measured else "n/a"
        shown = f"{measured:,}" if measured is not None else "n/a (cpu)"
        print(f"{case.name:<16} {f'{case.batch}x{case.seq}':>10} {predicted:>14,} "
              f"{shown:>14} {ratio:>7}")
    return rows


# --- the run -------------------------------------------------------------------------------------

def the_peak(plan: Plan) -> DensePeak:
    """The GPU's dense peak from the table (none, said so, for a GPU it lacks); on the dry run
    the CPU's estimate, labelled as one."""
    try:
        if plan.device == "cuda":
            return dense_peak(dtype=TRAIN_AUTOCAST)
        ghz, ghz_source = devices.cpu_clock_ghz()
        peak = devices.cpu_peak("float32", threads=torch.get_num_threads(),
                                capability=torch.backends.cpu.get_cpu_capability(), ghz=ghz,
                                ghz_source=ghz_source)
    except UnknownDeviceError as error:
        print(f"No dense peak, so no MFU: {error}")
        return dense_peak(peak_flop_per_s=False)
    return DensePeak(peak.flop_per_s, peak.source, "cpu", "float32")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="every part on the CPU with tiny models; the tests only collected")
    parser.add_argument("--skip-tests", action="store_true", help="leave out part 1")
    options = parser.parse_args(argv)
    if not options.cpu_dry_run and not torch.cuda.is_available():
        print("no CUDA: skipped (torch.cuda.is_available() is False: nothing to measure). "
              "--cpu-dry-run runs every part on the CPU with tiny models.")
        return 0
    plan = CPU_PLAN if options.cpu_dry_run else GPU_PLAN
    start = time.perf_counter()
    if plan.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failed = 0
    if not options.skip_tests:
        failed = run_cuda_tests(collect_only=options.cpu_dry_run)
        print(f"[{time.perf_counter() - start:.0f} s] CUDA tests: exit {failed}")
    peak = the_peak(plan)
    reports = profiles(plan, peak)
    print(f"[{time.perf_counter() - start:.0f} s] profiles done")
    train_steps(plan, peak)
    print(f"[{time.perf_counter() - start:.0f} s] training done")
    device_key = "cpu" if plan.device == "cpu" else peak.device
    if device_key in {d.key for d in device_table.DEVICES} | {"cpu"}:
        for name, report, tf32 in reports:
            print_roofline(name, report, device_key, tf32)
    else:
        print("No row of the device table for this GPU: no roofline to predict with.")
    print_memory(on_cuda=plan.device == "cuda")
    print(f"[{time.perf_counter() - start:.0f} s] done")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
