"""A model torch.export refuses but that runs is counted from one eager run at the dispatch level
(`exportflops.capture.eager`), by the same formula table, marked ``capture="eager"``: its matmul
FLOPs equal FlopCounterMode's on the same call, and the hand-made model's are derived by hand.
A call that does not run eagerly either, or that asks for dynamic sizes, still raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import exportflops
from exportflops.errors import ExportError

#: The ops whose FLOPs FlopCounterMode counts, by the name both sides give their packet.
_MATMUL = ("aten.mm", "aten.bmm", "aten.addmm", "aten.convolution", "aten.convolution_backward")


class Scores:
    """A plain result object: torch.export cannot flatten it ("not a known type")."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class StoresItsProduct(nn.Module):
    """Stores the product its forward computes on itself, uses it, and returns a `Scores`:
    it runs eagerly, and torch.export refuses its output. Its dropout (in training) draws from
    the random generator."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        self.cached = x @ self.w  # (3, 16) @ (16, 8)
        return Scores(self.head(self.drop(self.cached.relu())))  # (3, 8) @ (8, 4)


def _matmul_flops(report: exportflops.Report) -> int:
    """2 FLOPs per MAC over the matmul and convolution ops (FlopCounterMode's convention)."""
    return sum(2 * stats.cost.macs for op, stats in report.operators.items()
               if op.rsplit(".", 1)[0] in _MATMUL)


def _flop_counter(model: nn.Module, args: tuple, kwargs: dict, train: bool) -> int:
    """FlopCounterMode's total on the same call; in train mode its backward as ours runs it:
    from every floating output that needs a gradient, seeded with ones, to the parameters
    (``autograd.grad``: nothing accumulated into ``.grad``)."""
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(train):
        output = model(*args, **kwargs)
        if train:
            leaves = [output.logits] if isinstance(output, Scores) else [
                t for t in output.values() if isinstance(t, torch.Tensor) and t.requires_grad]
            torch.autograd.grad(leaves, list(model.parameters()),
                                [torch.ones_like(t) for t in leaves], allow_unused=True)
    return counter.get_total_flops()


def _hooks(model: nn.Module) -> int:
    return sum(len(hooks) for m in model.modules()
               for hooks in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks,
                             m._backward_pre_hooks))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("mode", ["forward", "train"])
def test_a_model_export_refuses_is_counted_from_its_eager_run(mode, device):
    torch.manual_seed(0)
    model = StoresItsProduct().to(device)
    x = torch.randn(3, 16, device=device)
    rng = torch.get_rng_state()

    report = exportflops.analyze(model, (x,), mode=mode)
    # Nothing left behind: the random state as it was (the dropout drew from a fork of it), no
    # hook, no gradient accumulated.
    assert torch.equal(torch.get_rng_state(), rng)
    assert _hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())

    assert report.capture == "eager"
    assert "torch.export refused StoresItsProduct" in report.capture_notes[0]
    # 1. forward: x @ w is 3 * 16 * 8 = 384 MACs; the head 3 * 8 * 4 = 96 MACs.
    forward = 2 * (3 * 16 * 8 + 3 * 8 * 4)
    # 2. backward: x needs no gradient, so x @ w's is the weight's alone, x^T @ g: 16 * 3 * 8
    #    MACs; the head's are its input's, g @ W: 3 * 4 * 8, and its weight's, g^T @ h: 4 * 3 * 8.
    backward = 2 * (16 * 3 * 8 + 3 * 4 * 8 + 4 * 3 * 8)
    expected = forward + (backward if mode == "train" else 0)
    assert _matmul_flops(report) == expected == _flop_counter(model, (x,), {}, mode == "train")
    # Attributed to modules: the head's forward and backward matmuls are the head's.
    assert report.module("head").inclusive.macs == 3 * 8 * 4 + (
        3 * 4 * 8 + 4 * 3 * 8 if mode == "train" else 0)
    assert report.module("head").calls == 1
    assert report.backward.macs == (backward // 2 if mode == "train" else 0)
    assert all(n.differentiates for n in report.nodes if n.phase == "backward")


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_the_eager_count_equals_the_export_count_where_both_capture(mode):
    """The same model returning its tensor, which export captures: the eager count of the
    refused one is the same cost, FLOPs, MACs and bytes by kind, forward and backward, though
    its ops are named as eager dispatches them (``addmm`` and ``t`` for ``linear``, ``mm`` for
    ``matmul``)."""
    torch.manual_seed(0)
    refused = StoresItsProduct().eval()  # no dropout: eager and export run the same ops

    class Returning(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = refused

        def forward(self, x):
            return self.inner(x).logits

    x = torch.randn(3, 16)
    eager = exportflops.analyze(refused, (x,), mode=mode)
    exported = exportflops.analyze(Returning(), (x,), mode=mode)
    assert (eager.capture, exported.capture) == ("eager", "export")
    assert eager.total == exported.total
    assert eager.backward == exported.backward
    assert "aten.addmm.default" in eager.operators and "aten.linear.default" in exported.operators


class NormedScores(nn.Module):
    """A convolution and a batch norm in training, whose running statistics the run updates in
    place, returning a `Scores`: refused by torch.export."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x):
        return Scores(self.norm(self.conv(x)))


def test_an_eager_count_leaves_the_buffers_and_counts_the_running_statistics_as_state():
    """The buffers the run updates are put back; the FLOPs, MACs and state bytes equal the
    export's of the same model returning its tensor. (Eager's ``native_batch_norm`` also writes
    the batch's mean and inverse deviation it saves, bytes export's ``batch_norm`` does not.)"""
    torch.manual_seed(0)
    model = NormedScores()

    class Returning(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner(x).logits

    x = torch.randn(2, 3, 8, 8)
    kept = {name: b.clone() for name, b in model.named_buffers()}
    eager = exportflops.analyze(model, (x,), mode="train")
    assert all(torch.equal(b, kept[name]) for name, b in model.named_buffers())
    exported = exportflops.analyze(Returning(), (x,), mode="train")
    assert eager.capture == "eager"
    for field in ("flops", "macs", "state_bytes_read", "state_bytes_written"):
        assert getattr(eager.total, field) == getattr(exported.total, field), field
    # The batch norm's count, num_batches_tracked += 1 in place: one int64 (8 bytes) of a buffer
    # the run writes, so state, read and written.
    [counted] = [n for n in eager.nodes if n.op == "aten.add_.Tensor"]
    assert (counted.cost.state_bytes_read, counted.cost.state_bytes_written) == (8, 8)


class BranchOnValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return Scores(self.proj(x)) if x.sum() > 0 else Scores(x)


@pytest.mark.parametrize("case", ["wrong-arguments", "does-not-run-on-meta", "dynamic-shapes"])
def test_a_refusal_the_eager_run_cannot_replace_is_raised(case):
    """Inputs forward does not take fail eagerly too; a branch on a value on meta cannot run;
    dynamic sizes need export's symbols: export's error is what the user acts on."""
    if case == "wrong-arguments":
        call = dict(model=StoresItsProduct(), args=(torch.randn(3, 16), torch.randn(2)))
    elif case == "does-not-run-on-meta":
        call = dict(model=BranchOnValue().to("meta"), args=(torch.randn(2, 8, device="meta"),))
    else:
        call = dict(model=StoresItsProduct(), args=(torch.randn(3, 16),),
                    dynamic_shapes=({0: torch.export.Dim("rows")},))
    with pytest.raises(ExportError, match="torch.export could not capture"):
        exportflops.analyze(call.pop("model"), call.pop("args"), **call)


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_levit_is_counted_from_its_eager_run(mode):
    """LeViT built from its config (`exportflops.hf`, on meta): its attention memoizes on
    itself, in ``forward``, the biases it gathers (``attention_bias_cache``), which
    ``torch.export.export`` itself refuses as a lifted fake constant (torch 2.13, on meta and on
    cpu); FlopCounterMode counts its eager run, and so does analyze now."""
    pytest.importorskip("transformers")
    from exportflops import hf

    model, args, kwargs = hf.build("levit")
    with pytest.raises(RuntimeError, match="fake tensor in the exported program constant"):
        torch.export.export(model, args, kwargs)
    report = exportflops.analyze(model, args, kwargs, mode=mode)
    assert report.capture == "eager"
    assert report.capture_notes[0].startswith("torch.export refused LevitModel")
    assert report.uncounted == []
    assert _matmul_flops(report) == _flop_counter(model, args, kwargs, mode == "train")
    assert _hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())
