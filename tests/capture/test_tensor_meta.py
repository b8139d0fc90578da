"""Reading a plainly contiguous value's memory format off its strides, and asking each other
shape's once, change nothing but the time a dynamic export takes:
every node's ``tensor_meta`` (memory format included) and ``torch_fn``, the guards and the
ranges are torch's own, for contiguous, channels-last and transposed values, and torch's
function is back after the block, also when the export fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

import torch.fx.experimental.proxy_tensor as tracer
from exportflops.capture import tensor_meta
from exportflops.examples.gpt2 import Block, GPTConfig

from tests.capture.test_shape_kernels import _nodes, _shapes


class Convolutions(nn.Module):
    """Two convolutions of a channels-last image, a transpose of the result, a one-channel
    map (contiguous and channels-last at once) and a 5-d pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.squeeze = nn.Conv2d(8, 1, 1)

    def forward(self, image):
        hidden = self.second(torch.relu(self.first(image)))
        volume = hidden.unsqueeze(2).expand(-1, -1, 2, -1, -1)
        return (hidden.transpose(2, 3), self.squeeze(hidden),
                torch.nn.functional.avg_pool3d(volume, 1))


class Slices(nn.Module):
    """Sizes no size symbol's multiple: a slice's (n - 1), a concatenation's (2n - 1); their
    formats are torch's to ask, not read off the strides."""

    def forward(self, x):
        tail = x[:, 1:] * 2
        return torch.cat([x, tail], dim=1) + 1, tail.transpose(0, 1)


def _image() -> torch.Tensor:
    return torch.zeros(2, 3, 8, 8).to(memory_format=torch.channels_last)


def _block():
    with torch.device("meta"):
        return Block(GPTConfig(n_embd=64, n_head=4)).eval(), torch.zeros(1, 16, 64, device="meta")


CASES = {
    "a GPT-2 block, dynamic length": (_block, lambda inputs: ({1: Dim("seq", max=64)},)),
    "convolutions, dynamic batch, height and width": (
        lambda: (Convolutions(), _image()),
        lambda inputs: ({0: Dim("batch", max=8), 2: Dim("h", max=64), 3: Dim("w", max=64)},)),
    "a slice and a concatenation, dynamic length": (
        lambda: (Slices(), torch.zeros(3, 16)), lambda inputs: ({1: Dim("n", min=3, max=64)},)),
}


def _tensor_metas(program: torch.export.ExportedProgram) -> list[tuple]:
    """Each node's tensor metadata, and the torch function torch's tracer names it by (which
    counts the tracer's own reads of sizes and strides)."""
    return [(str(node.meta.get("tensor_meta")), node.meta.get("torch_fn"))
            for node in program.graph.nodes]


def _export(model, inputs, shapes):
    with torch.no_grad():
        return torch.export.export(model, (inputs,), dynamic_shapes=shapes)


@pytest.mark.parametrize("name", list(CASES))
def test_the_program_and_its_memory_formats_are_torchs_own(name, monkeypatch):
    build, dynamic = CASES[name]
    model, inputs = build()
    torchs = _export(model, inputs, dynamic(inputs))
    asked = []
    torch_extract = tracer._extract_tensor_metadata

    def counted(result, include_contiguity=True):
        asked.append(include_contiguity)
        return torch_extract(result, include_contiguity)

    monkeypatch.setattr(tracer, "_extract_tensor_metadata", counted)
    with tensor_meta.memory_formats_once():
        ours = _export(model, inputs, dynamic(inputs))
    assert _tensor_metas(ours) == _tensor_metas(torchs)
    assert _nodes(ours) == _nodes(torchs)
    assert _shapes(ours) == _shapes(torchs)
    formats = {str(n.meta["tensor_meta"].memory_format) for n in torchs.graph.nodes
               if isinstance(n.meta.get("tensor_meta"), tuple)}
    assert len(formats) > 1  # more than one format was asked (contiguous, None, ...)
    assert 0 < asked.count(True) < len(asked)  # asked once per shape, not per value


def test_torchs_function_is_back_after_the_block_also_when_the_export_fails():
    before = tracer._extract_tensor_metadata

    class Fails(nn.Module):
        def forward(self, x):
            raise RuntimeError("the model fails")

    with pytest.raises(RuntimeError, match="the model fails"):
        with tensor_meta.memory_formats_once():
            assert tracer._extract_tensor_metadata is not before
            _export(Fails(), torch.zeros(2, 4), ({0: Dim("n", max=8)},))
    assert tracer._extract_tensor_metadata is before
