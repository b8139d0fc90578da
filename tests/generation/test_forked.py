"""`forked.beside`: the work runs in a forked child only where that is safe (every tensor on
meta, Linux, two CPUs or more), and the result is the same as the work run here."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from exportflops.generation import forked
from exportflops.generation.forked import beside, can_fork

META = torch.zeros(2, device="meta")
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="forks only on Linux with two CPUs or more")


def test_meta_work_runs_in_a_child_and_real_tensors_here():
    with beside(os.getpid, META) as pid:
        assert pid() != os.getpid()
    with beside(os.getpid, torch.zeros(2)) as pid:
        assert pid() == os.getpid()
    assert not can_fork(torch.nn.Linear(2, 2))  # a module's parameters are read too
    assert can_fork(torch.nn.Linear(2, 2, device="meta"))


def test_a_child_that_fails_gives_way_to_the_work_run_here():
    parent = os.getpid()

    def only_here() -> int:
        if os.getpid() != parent:
            raise RuntimeError("not in the child")
        return 7

    with beside(only_here, META) as result:
        assert result() == 7


def test_a_caller_that_fails_leaves_no_child_behind():
    with pytest.raises(KeyError), beside(lambda: sum(range(10**9)), META):
        raise KeyError("the caller's own error")
    with pytest.raises(ChildProcessError):  # every child of this process was reaped
        os.waitpid(-1, os.WNOHANG)


def test_generation_is_the_same_forked_or_not(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from exportflops import analyze_generation

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.zeros(1, 5, dtype=torch.long, device="meta")
    assert can_fork((model, prompt))  # the prefill is exported in a child
    in_child = analyze_generation(model, prompt, new_tokens=4)
    monkeypatch.setattr(forked, "can_fork", lambda reads: False)
    here = analyze_generation(model, prompt, new_tokens=4)
    assert in_child.model_dump() == here.model_dump()
