"""An eager count never claims work that left torch (`exportflops.capture.outside`): values handed
to numpy, or to Python as floats, and tensors made again from host values after such a read are
each an uncounted call, named, in the module where it ran, and so is a buffer ``torch.empty``
made that something outside torch filled (a C extension); reads that decide sizes, tensors made
from constants and buffers that ops fill stay free."""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch import nn

import exportflops
from exportflops.errors import ExportError, UncountedOpError


class Scores:
    """A plain result object: torch.export cannot flatten it, so the eager run counts."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class ThroughNumpy(nn.Module):
    """Doubles its projection in numpy: torch.export refuses ``.numpy()`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.from_numpy(self.proj(x).detach().numpy() * 2)


class Head(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.proj = nn.Linear(8, 8)

    def forward(self, x, lengths):
        y = self.proj(x)
        if self.how == "item":  # Python's arithmetic on a float read out of torch
            return y * (y.abs().max().item() * 2)
        if self.how == "tolist":  # a tensor made again from values Python computed
            return torch.tensor([v * 2 for v in y[0].tolist()])
        if self.how == "sizes":  # an integer read deciding a size, a tensor of constants
            return y[:, : int(lengths.max())] * torch.tensor([0.5])
        raise ValueError(self.how)


class Wrapped(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.head = Head(how)

    def forward(self, x, lengths):
        return Scores(self.head(x, lengths))


def test_a_numpy_round_trip_is_two_uncounted_calls_not_full_coverage():
    report = exportflops.analyze(ThroughNumpy(), (torch.randn(2, 8),))
    assert report.capture == "eager"
    # The linear's addmm is the one op counted (2 * 8 * 8 MACs); the values leaving for numpy
    # and the tensor made from numpy's result are the two calls torch did not see: 1 / (1 + 2).
    assert report.total.macs == 2 * 8 * 8
    assert report.coverage == pytest.approx(1 / 3)
    assert report.unsupported_ops() == {"Tensor.numpy": 1, "torch.from_numpy": 1}
    numpy, made = report.uncounted
    assert numpy.modules == made.modules == [""]
    assert "float32 tensor left torch (Tensor.numpy)" in numpy.reason
    assert ("after the run handed values out of torch (Tensor.numpy in the root module)"
            in made.reason)


@pytest.mark.parametrize("how, uncounted", [
    # .item() of a float: its value left torch for Python's arithmetic.
    ("item", {"Tensor.item": 1}),
    # .tolist() of a float, then torch.tensor of what Python computed on it: two crossings.
    ("tolist", {"Tensor.tolist": 1, "torch.tensor": 1}),
    # int() of an integer tensor decides a size the ops follow, and torch.tensor([0.5]) holds
    # a constant: both free.
    ("sizes", {}),
], ids=["item", "tolist", "sizes"])
def test_values_that_leave_for_python_are_uncounted_in_their_module(how, uncounted):
    x, lengths = torch.randn(2, 8), torch.tensor([3, 5])
    report = exportflops.analyze(Wrapped(how), (x, lengths))
    assert report.capture == "eager"
    assert report.unsupported_ops() == uncounted
    assert all(u.modules == ["head"] for u in report.uncounted)
    # The ops counted: "item" the linear's addmm, abs, max and the multiply; "tolist" the
    # addmm alone (y[0] is a view, Python's doubling unseen); "sizes" the addmm, lengths' max
    # and the multiply (the slice a view). Coverage is counted / (counted + uncounted calls).
    counted = {"item": 4, "tolist": 1, "sizes": 3}[how]
    assert report.coverage == pytest.approx(counted / (counted + sum(uncounted.values())))


def test_strict_refuses_values_handed_to_numpy_and_says_what_to_do():
    with pytest.raises(UncountedOpError, match=r"Could not count Tensor\.numpy \(node 'numpy' "
                       r"in module '<root>'\): the values of a float32 tensor left torch.*"
                       r"Compute it with torch ops to count it\. Or analyze with strict=False"):
        exportflops.analyze(ThroughNumpy(), (torch.randn(2, 8),), strict=True)


class WrittenInC(nn.Module):
    """Copies its projection into a buffer ``torch.empty_like`` made, through ``ctypes`` (as a
    C extension writes through ``data_ptr``), then doubles it or returns it."""

    def __init__(self, returned: bool) -> None:
        super().__init__()
        self.returned = returned
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        out = torch.empty_like(y)
        ctypes.memmove(out.data_ptr(), y.data_ptr(), y.numel() * y.element_size())
        return Scores(out if self.returned else out * 2)


@pytest.mark.parametrize("returned", [False, True], ids=["read", "returned"])
def test_a_buffer_written_outside_torch_is_uncounted(returned):
    report = exportflops.analyze(WrittenInC(returned), (torch.randn(2, 8),))
    assert report.capture == "eager"
    assert report.unsupported_ops() == {"written outside torch": 1}
    [unseen] = report.uncounted
    use = "returned by the model" if returned else "read by node 'mul' in the root module"
    assert unseen.reason.startswith(f"the tensor allocated at node 'empty_like' in the root "
                                    f"module is {use} though no op torch dispatched wrote it")
    # Counted: the addmm, and the doubling where it runs; one uncounted entry.
    counted = 1 if returned else 2
    assert report.coverage == pytest.approx(counted / (counted + 1))


class FilledByOps(nn.Module):
    """Allocations every one of which an op fills before it is read: a copy into a view, an
    in-place fill, an ``out=``."""

    def forward(self, x):
        a = torch.empty(4, 4)
        a.view(16).copy_(torch.arange(16.0))
        b = torch.empty(3).normal_()
        c = torch.empty(2, 2)
        torch.add(x, 1, out=c)
        return Scores(a.sum() + b.sum() + c.sum() + torch.empty_like(a).fill_(1).sum())


def test_allocations_filled_by_dispatched_ops_are_counted_in_full():
    report = exportflops.analyze(FilledByOps(), (torch.randn(2, 2),))
    assert report.capture == "eager"
    assert report.uncounted == [] and report.coverage == 1.0


def test_a_numpy_round_trip_on_meta_is_refused_with_the_way_to_count_it():
    # On meta there are no values for numpy, so no eager run: the refusal says to run on cpu.
    with pytest.raises(ExportError) as failed:
        exportflops.analyze(ThroughNumpy().to("meta"), (torch.randn(2, 8, device="meta"),))
    assert failed.value.hint.startswith("the model hands a tensor's values to numpy, which "
                                        "torch.export cannot trace. On cpu")
