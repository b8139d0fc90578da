"""Where one symbolic analysis of GPT-2 124M (on meta, a dynamic ``seq``) spends its time, against
one FlopCounterMode run, and the floor torch.export sets: its symbolic export of one block.

Issue 53 asks one symbolic analysis to cost at most one FlopCounterMode run. The fast path
exports the model once with blocks 1-11 stubbed, so the export traces one block with a
symbolic length; this times that block's export alone (one ``Block`` exported as the fast
path exports, `exportflops.capture.export.capture_forward`, with the shape kernels of
`exportflops.capture.shape_kernels`), and the same with a static length, and one causal SDPA
on meta against the same on cpu (on meta the shape kernel makes SDPA's output; torch's own
fake kernel there is its math decomposition with symbolic sizes, which made this export four
times as dear; on cpu torch runs the flash kernel's meta function, with other output
strides). Each case alternates with the others ``--repeat`` times; the process's CPU time is
taken (other processes share the machine), medians and the fastest run printed.

    python benchmarks/symbolic_floor.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.export import Dim
from torch.utils.flop_counter import FlopCounterMode

from exportflops import analyze
from exportflops.examples.gpt2 import GPT, Block, GPTConfig, gpt2
from exportflops.capture.export import capture_forward


class _Attention(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = x.view(B, T, 12, C // 12).transpose(1, 2)  # (B, nh, T, hs)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


def _cases() -> dict:
    seq = Dim("seq", max=1024)
    model, args = gpt2("meta", seq_len=16)
    with torch.device("meta"):
        block = Block(GPTConfig()).eval()
    x = torch.zeros(1, 16, 768, device="meta")

    def counter() -> None:
        with FlopCounterMode(display=False), torch.no_grad():
            model(*args)

    def exported(module, example, dynamic):
        return lambda: capture_forward(module, (example,), dynamic_shapes=dynamic)

    return {
        "analyze(GPT-2, dynamic seq)": lambda: analyze(model, args,
                                                       dynamic_shapes=({1: seq},)),
        "FlopCounterMode run of GPT-2": counter,
        "export of one Block, dynamic seq": exported(block, x, ({1: seq},)),
        "export of one Block, static": exported(block, x, None),
        "export of causal SDPA on meta, dynamic": exported(_Attention(), x, ({1: seq},)),
        "export of causal SDPA on cpu, dynamic": exported(
            _Attention(), torch.zeros(1, 16, 768), ({1: seq},)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    # torch's and sympy's one-time imports and caches, billed to no case.
    with torch.device("meta"):
        tiny = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=128))
    analyze(tiny, (torch.zeros(1, 8, dtype=torch.long, device="meta"),),
            dynamic_shapes=({1: Dim("seq", max=1024)},))
    cases = _cases()
    for run in cases.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, run in cases.items():
            start = time.process_time()
            run()
            seconds[name].append(time.process_time() - start)
    counter = statistics.median(seconds["FlopCounterMode run of GPT-2"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU seconds, "
          f"{repeat} runs each, alternating")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"  {name:<42} median {median:6.3f}  fastest {min(times):6.3f}  "
              f"= {median / counter:5.2f} FlopCounterMode runs")


if __name__ == "__main__":
    main()
