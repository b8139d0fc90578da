"""A report's JSON is the same bytes whatever Python's string hashing seed: two interpreters
with different ``PYTHONHASHSEED`` values analyze the same model (a set's iteration order
changes with the seed, so anything built by iterating a set shows here)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import torch
from exportflops import analyze
from exportflops.examples.gpt2 import GPT, GPTConfig
with torch.device("meta"):
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=128, block_size=32))
ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
print(analyze(model, (ids,), mode="train").model_dump_json())
"""


def _report_json(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return done.stdout


def test_a_report_is_the_same_json_under_two_hash_seeds():
    first, second = _report_json("1"), _report_json("2")
    assert first.strip()
    assert first == second
