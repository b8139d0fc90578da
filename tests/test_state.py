"""No global state left behind: the process's exception hook, the random generators' states,
grad mode, the default dtype and device are the same after each public entry point as before,
whether it succeeded or failed."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

import exportflops
import exportflops.aggregate
from exportflops.capture.shape_kernels import _KERNELS
from exportflops.errors import ExportFlopsError


def _state() -> dict:
    state = {"excepthook": sys.excepthook, "grad": torch.is_grad_enabled(),
             "dtype": torch.get_default_dtype(),
             "device": torch.empty(0).device, "cpu_rng": torch.get_rng_state(),
             "process_group": dist.is_available() and dist.is_initialized(),
             # Python kernels on torch's ops: the shape kernels of an export with dynamic sizes
             "op_kernels": {str(op): dict(op.py_kernels) for op in _KERNELS}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def _same(before: dict, after: dict) -> None:
    assert after.keys() == before.keys()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(after[key], value), key
        elif isinstance(value, list):
            assert all(torch.equal(a, b) for a, b in zip(after[key], value)), key
        else:
            assert after[key] == value, key


class BranchOnValue(nn.Module):
    """Branches on a value of its input: export refuses it on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x) if x.sum() > 0 else x


def _analyze(mode: str, *, fails: bool, dynamic: bool = False):
    """The call, its model and inputs built first (building draws random numbers); with a
    dynamic batch size the export runs the shape kernels."""
    if fails:
        model, args = BranchOnValue().to("meta"), (torch.randn(2, 8, device="meta"),)
    else:
        model, args = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)), (torch.randn(2, 8),)
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    return lambda: exportflops.analyze(model, args, mode=mode, dynamic_shapes=shapes)


def _process_group(*, fails: bool):
    def run():
        with exportflops.fake_process_group(2):
            if fails:
                raise RuntimeError("the user's code failed inside the block")
    return run


def _flops_per_batch(*, fails: bool):
    """A mixture of experts picked by value: flops_per_batch runs it once on the example."""
    from tests.training.test_flops_per_batch import LoopedExperts

    model = LoopedExperts()
    if fails:
        model, x = BranchOnValue().to("meta"), torch.randn(2, 8, device="meta")
        return lambda: exportflops.flops_per_batch(model, (x,))
    x = torch.randn(2, 8, 16)
    shapes = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},)
    return lambda: exportflops.flops_per_batch(model, (x,), dynamic_shapes=shapes)


def _profile(*, fails: bool):
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    args = (torch.randn(2, 8, device="meta"),) if fails else (torch.randn(2, 8),)
    return lambda: exportflops.profile(model, args, warmup=1, repeat=2)


def _generation(*, fails: bool):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                     vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    prompt = torch.zeros(1, 20 if fails else 4, dtype=torch.long)
    return lambda: exportflops.analyze_generation(model, prompt, new_tokens=2)


def _tiny_llama():
    """A 1-layer transformers Llama of hidden size 32."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config)


def _generation_memory(*, fails: bool):
    """A Llama's prefill and decode steps; the failing one asks for one new token (no decode)."""
    from exportflops.generation import generation_memory

    model = _tiny_llama()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    return lambda: generation_memory(model, prompt, new_tokens=1 if fails else 2)


def _memory(*, fails: bool):
    model = BranchOnValue() if fails else nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    args = (torch.randn(2, 8),)
    return lambda: exportflops.memory(model, args)


class Blocks(nn.Module):
    """Two blocks in a ModuleList (what fit() checkpoints) after a layer whose output needs a
    gradient, so that a checkpointed block's parameters get theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
                                     for _ in range(2)])

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return x


def _fit(*, fails: bool):
    model, args = Blocks(), (torch.randn(4, 8),)
    return lambda: exportflops.fit(model, args, budget=1 if fails else "1GiB",
                                   search_batch=False)


def _ranks(*, fails: bool):
    """An FSDP2 count of two ranks: a mesh and a process group exist during it."""
    from exportflops.parallel import Layout, analyze_ranks

    model, args = Blocks(), (torch.randn(4, 8),)
    layout = Layout(fsdp=2)
    return lambda: analyze_ranks(model, args, layout=layout, rank=2 if fails else 0)


def _memory_ranks(*, fails: bool):
    from exportflops.parallel import Layout, memory_ranks

    model, args = Blocks(), (torch.randn(4, 8),)
    return lambda: memory_ranks(model, args, layout=Layout(fsdp=2), rank=2 if fails else 0)


def _pipeline_memory(*, fails: bool):
    """A pipeline rank's step: torch's pipeline() splits the model, wrapping forwards."""
    from exportflops.parallel import Layout, memory_ranks

    model, args = Blocks(), (torch.randn(4, 8),)
    return lambda: memory_ranks(model, args, layout=Layout(pp=2), rank=0,
                                schedule="zbvzerobubble" if fails else "gpipe")


def _expert_memory(*, fails: bool):
    """An expert-parallel rank's step: a fake process group, the experts swapped on the copy;
    the eager experts loop fails inside it (it reads the routing)."""
    from exportflops.parallel import Layout, memory_ranks
    from tests.footprint.models import mixtral

    model, args, kwargs = mixtral()
    if fails:
        model.set_experts_implementation("eager")
    return lambda: memory_ranks(model, args, kwargs, layout=Layout(dp=2, ep=2), rank=1,
                                mode="forward")


def _conventions(*, fails: bool):
    model = _tiny_llama()
    ids = torch.zeros(1, 8, dtype=torch.long)
    report = exportflops.analyze(model, (ids,), mode="train")
    return lambda: exportflops.conventions(report, config=None if fails else model)


@pytest.mark.parametrize("prepare, fails", [
    (lambda: _analyze("forward", fails=False), False),
    (lambda: _analyze("train", fails=False), False),
    (lambda: _analyze("forward", fails=True), True),
    (lambda: _analyze("train", fails=True), True),
    (lambda: _analyze("forward", fails=False, dynamic=True), False),
    (lambda: _analyze("forward", fails=True, dynamic=True), True),
    (lambda: _process_group(fails=False), False),
    (lambda: _process_group(fails=True), True),
    (lambda: _flops_per_batch(fails=False), False),
    (lambda: _flops_per_batch(fails=True), True),
    (lambda: _profile(fails=False), False),
    (lambda: _profile(fails=True), True),
    (lambda: _generation(fails=False), False),
    (lambda: _generation(fails=True), True),
    (lambda: _generation_memory(fails=False), False),
    (lambda: _generation_memory(fails=True), True),
    (lambda: _memory(fails=False), False),
    (lambda: _memory(fails=True), True),
    (lambda: _fit(fails=False), False),
    (lambda: _fit(fails=True), True),
    (lambda: _ranks(fails=False), False),
    (lambda: _ranks(fails=True), True),
    (lambda: _memory_ranks(fails=False), False),
    (lambda: _memory_ranks(fails=True), True),
    (lambda: _pipeline_memory(fails=False), False),
    (lambda: _pipeline_memory(fails=True), True),
    (lambda: _expert_memory(fails=False), False),
    (lambda: _expert_memory(fails=True), True),
    (lambda: _conventions(fails=False), False),
    (lambda: _conventions(fails=True), True),
], ids=["analyze", "analyze-train", "analyze-fails", "analyze-train-fails", "analyze-dynamic",
        "analyze-dynamic-fails", "process-group",
        "process-group-fails", "flops-per-batch", "flops-per-batch-fails", "profile",
        "profile-fails", "generation", "generation-fails",
        "generation-memory", "generation-memory-fails", "memory", "memory-fails", "fit",
        "fit-fails", "ranks", "ranks-fails", "memory-ranks", "memory-ranks-fails",
        "pipeline-memory", "pipeline-memory-fails", "expert-memory", "expert-memory-fails",
        "conventions", "conventions-fails"])
def test_an_entry_point_leaves_the_process_state_as_it_found_it(prepare, fails):
    torch.manual_seed(0)
    call = prepare()
    before = _state()
    if fails:
        with pytest.raises((ExportFlopsError, RuntimeError)):
            call()
    else:
        call()
    _same(before, _state())


def _running(code) -> bool:
    frame = sys._getframe()
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def test_the_collector_stays_paused_while_analyze_builds_its_report():
    """A full collection traverses the whole heap of a process holding torch (0.2 s beside a
    Llama-3-70B fast analysis of about 1 s, benchmarks/oneshot.py): the report is built with
    the collector paused, as the count is. A threshold of 1 makes every allocation made with the
    collector on start a collection."""
    model, args = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), (torch.ones(2, 8),)
    exportflops.analyze(model, args)  # one-time imports and caches outside the test
    during_build = []

    def collecting(phase: str, info: dict) -> None:
        if phase == "start":
            during_build.append(_running(exportflops.aggregate.build_report.__code__))

    threshold = gc.get_threshold()
    gc.callbacks.append(collecting)
    gc.set_threshold(1)
    try:
        exportflops.analyze(model, args)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collecting)
    assert during_build and not any(during_build)
