"""The shape kernels change nothing but the time an export with dynamic sizes takes: for each
case the program exported with them has torch's own nodes (op, arguments, and each value's
shape, strides, dtype and device), guards and ranges, whether the kernel made the output
or fell back to torch's composite; and the kernels are gone after the block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import exportflops
import exportflops.capture.export
from exportflops.capture import shape_kernels as kernels
from exportflops.examples.gpt2 import Block, GPTConfig, gpt2
from exportflops.graph.walk import shape_env

aten = torch.ops.aten


class Linear(nn.Module):
    def __init__(self, bias: bool = True, transposed: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8, bias=bias)
        self.transposed = transposed

    def forward(self, x):
        return self.proj(x.transpose(0, 1) if self.transposed else x)


class LayerNorm(nn.Module):
    def __init__(self, shape: tuple[int, ...], affine: bool = True, permuted: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(shape, elementwise_affine=affine)
        self.permuted = permuted

    def forward(self, x):
        return self.norm(x.permute(1, 0, 2) if self.permuted else x)


class Attention(nn.Module):
    """Self-attention over (B, T, 4 heads x 8), or cross-attention to a second input."""

    def __init__(self, mask: str | None = None, causal: bool = False, gqa: bool = False,
                 value_dim: int = 8) -> None:
        super().__init__()
        self.mask, self.causal, self.gqa, self.value_dim = mask, causal, gqa, value_dim

    def forward(self, x, memory=None):
        B, T, _ = x.shape
        q = x.view(B, T, 4, 8).transpose(1, 2)  # (B, nh, T, hs)
        source = x if memory is None else memory
        S = source.shape[1]
        heads = 2 if self.gqa else 4
        k = source[..., :heads * 8].reshape(B, S, heads, 8).transpose(1, 2)
        v = source[..., :heads * self.value_dim].reshape(B, S, heads, self.value_dim)
        v = v.transpose(1, 2)
        mask = None
        if self.mask == "bool":  # (T, S), broadcast over batch and heads
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril()
        elif self.mask == "float":  # (B, 1, T, S)
            mask = torch.zeros(B, 1, T, S, dtype=x.dtype, device=x.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                              enable_gqa=self.gqa)


SEQ = Dim("seq", max=64)
MEMORY = Dim("memory", max=64)


def _on(device, dtype=torch.float32, *shapes):
    return tuple(torch.zeros(*shape, device=device, dtype=dtype) for shape in shapes)


class Elementwise(nn.Module):
    """GELU, then sums, products and a quotient with a broadcast (T, C) and a (B, 1, C)
    tensor, a Python scalar (a 0-dim tensor: torch's), and the input's transpose."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position", torch.zeros(1, 16))

    def forward(self, x):
        B, T, C = x.shape
        y = F.gelu(x, approximate="tanh") + self.position.expand(T, C).contiguous()
        y = (y * x[:, :1].contiguous() - x) / (x * 2.0)
        return y.transpose(0, 1).transpose(-1, -2)


class Counts(nn.Module):
    """Integer sums: torch's."""

    def forward(self, ids):
        return ids + ids


class Contiguous(nn.Module):
    """A (B, T, C) input, transposed or not, then ``contiguous()``, then a sum (the copy is
    read)."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed

    def forward(self, x):
        y = x.view(x.shape[0], x.shape[1], 2, -1)
        y = y.transpose(1, 2) if self.transposed else y
        return y.contiguous() + 1


class Views(nn.Module):
    """Views of a (B, T, 24) input: heads split off a contiguous input and off a split's
    chunk (not contiguous), merged back, the same sizes; and torch's: a merge of the dynamic
    length, a -1, a 1-d view, a dim split off the dynamic length."""

    def forward(self, x):
        B, T, C = x.shape
        chunk, rest = x.split(12, dim=2)
        heads = chunk.view(B, T, 3, 4)
        merged = x.view(B, T, 2, 3, 4).view(B, T, 6, 4).view(B, T, 24)
        same = rest.view(B, T, 12)
        flat = x.view(B, T * C)
        inferred = x.view(B, -1, 4)
        line = x.contiguous().view(B * T * C)
        return heads + 1, merged * 2, same - 1, flat, inferred, line


class Embeddings(nn.Module):
    """Rows of a table at int64 and int32 indices."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 8)

    def forward(self, ids):
        return self.table(ids), self.table(ids.int())


class LastPosition(nn.Module):
    """A norm and a head on the last position of a dynamic length: static sizes inside a
    dynamic export."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.head = nn.LayerNorm(16), nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.head(self.norm(x[:, [-1]]))


class Masked(nn.Module):
    """The rows a mask keeps: their number is read from values (an unbacked size), so the
    GELU of them is torch's."""

    def forward(self, x):
        return F.gelu(x[x.sum(-1) > 0])


SDPA = "scaled_dot_product_attention"
BATCH = Dim("batch", max=8)
FLOAT = torch.float32

# (model, inputs, dynamic_shapes, kernel -> what its calls did: True made, False torch's).
CASES = {
    "linear, 3-d input": (Linear(), _on("meta", FLOAT, (2, 5, 16)), ({1: SEQ},),
                          {"linear": {True}}),
    "linear, 2-d input, no bias": (Linear(bias=False), _on("meta", FLOAT, (5, 16)),
                                   ({0: SEQ},), {"linear": {True}}),
    "linear on cpu, batch and length dynamic": (
        Linear(), _on("cpu", FLOAT, (2, 5, 16)), ({0: BATCH, 1: SEQ},), {"linear": {True}}),
    "linear of a transposed input (torch's)": (
        Linear(transposed=True), _on("meta", FLOAT, (5, 2, 16)), ({0: SEQ},),
        {"linear": {False}, "transpose": {True}}),
    "layer norm of the last dim": (LayerNorm((16,)), _on("meta", FLOAT, (2, 5, 16)),
                                   ({1: SEQ},), {"layer_norm": {True}}),
    "layer norm of two dims, no affine": (
        LayerNorm((5, 16), affine=False), _on("meta", FLOAT, (2, 5, 16)), ({0: BATCH},),
        {"layer_norm": {True}}),
    "layer norm of a permuted input (torch's)": (
        LayerNorm((16,), permuted=True), _on("meta", FLOAT, (5, 2, 16)), ({0: SEQ},),
        {"layer_norm": {False}}),
    "causal self-attention": (Attention(causal=True), _on("meta", FLOAT, (2, 5, 32)),
                              ({1: SEQ},), {SDPA: {True}, "transpose": {True}}),
    "causal self-attention in bfloat16": (
        Attention(causal=True), _on("meta", torch.bfloat16, (2, 5, 32)), ({1: SEQ},),
        {SDPA: {True}}),
    "cross-attention, two lengths, other value width": (
        Attention(value_dim=4), _on("meta", FLOAT, (2, 5, 32), (2, 7, 32)),
        ({1: SEQ}, {1: MEMORY}), {SDPA: {True}}),
    "attention with a boolean (T, S) mask": (
        Attention(mask="bool"), _on("meta", FLOAT, (2, 5, 32)), ({1: SEQ},), {SDPA: {True}}),
    "attention with a float (B, 1, T, S) mask": (
        Attention(mask="float"), _on("meta", FLOAT, (2, 5, 32)), ({1: SEQ},), {SDPA: {True}}),
    "attention with grouped heads (torch's)": (
        Attention(gqa=True), _on("meta", FLOAT, (2, 5, 32)), ({1: SEQ},), {SDPA: {False}}),
    "attention on cpu (torch's: its flash kernel has other strides)": (
        Attention(causal=True), _on("cpu", FLOAT, (2, 5, 32)), ({1: SEQ},), {SDPA: {False}}),
    "gelu, broadcast sums and products, a scalar, transposes": (
        Elementwise(), _on("meta", FLOAT, (2, 5, 16)), ({1: SEQ},),
        {"gelu": {True}, "add": {True}, "sub": {True}, "mul": {True, False}, "div": {True},
         "transpose": {True}}),
    "elementwise on cpu": (Elementwise(), _on("cpu", FLOAT, (2, 5, 16)), ({1: SEQ},),
                           {"gelu": {True}, "add": {True}}),
    "contiguous of a transposed input": (Contiguous(True), _on("meta", FLOAT, (2, 5, 16)),
                                         ({1: SEQ},), {"contiguous": {True}}),
    "contiguous on cpu, batch and length dynamic": (
        Contiguous(True), _on("cpu", FLOAT, (2, 5, 16)), ({0: BATCH, 1: SEQ},),
        {"contiguous": {True}}),
    "contiguous of a contiguous input (torch returns it, before the op)": (
        Contiguous(False), _on("meta", FLOAT, (2, 5, 16)), ({1: SEQ},), {"contiguous": set()}),
    "views: heads split off and merged back, and torch's": (
        Views(), _on("meta", FLOAT, (2, 5, 24)), ({1: SEQ},), {"view": {True, False}}),
    "views on cpu, batch and length dynamic": (
        Views(), _on("cpu", FLOAT, (2, 5, 24)), ({0: BATCH, 1: SEQ},), {"view": {True, False}}),
    "embeddings at int64 and int32 indices": (
        Embeddings(), (torch.zeros(2, 5, dtype=torch.long, device="meta"),), ({1: SEQ},),
        {"embedding": {True}}),
    "embeddings on cpu": (Embeddings(), (torch.zeros(2, 5, dtype=torch.long),), ({1: SEQ},),
                          {"embedding": {True}}),
    "a head on the last position (static sizes)": (
        LastPosition(), _on("meta", FLOAT, (2, 5, 16)), ({1: SEQ},),
        {"layer_norm": {True}, "linear": {True}}),
    "gelu of rows a mask keeps (a size read from values: torch's)": (
        Masked(), _on("cpu", FLOAT, (2, 5, 16)), ({1: SEQ},), {"gelu": {False}}),
    "integer sums (torch's)": (Counts(), (torch.zeros(2, 5, dtype=torch.long,
                                                      device="meta"),),
                               ({1: SEQ},), {"add": {False}}),
}


def _nodes(program: torch.export.ExportedProgram) -> list:
    """Each node's op, its arguments (nodes by their place: export numbers the size reads it
    drops, which the kernels do not make), and each value's metadata with the place of the
    first value sharing its storage (a view's base)."""
    place = {node: i for i, node in enumerate(program.graph.nodes)}
    storages: dict[int, int] = {}

    def argument(a):
        return ("node", place[a]) if isinstance(a, torch.fx.Node) else str(a)

    def meta(value, at):
        if isinstance(value, torch.Tensor):
            base = storages.setdefault(value.untyped_storage()._cdata, at)
            return (tuple(map(str, value.shape)), tuple(map(str, value.stride())),
                    str(value.storage_offset()), value.dtype, value.device, base)
        return str(value)

    return [(node.op, str(node.target),
             torch.fx.node.map_aggregate((node.args, node.kwargs), argument),
             [meta(v, place[node]) for v in torch.utils._pytree.tree_leaves(node.meta.get("val"))])
            for node in program.graph.nodes]


def _shapes(program: torch.export.ExportedProgram) -> tuple:
    env = shape_env(program.graph)
    return (str(program.range_constraints), sorted(str(g.expr) for g in env.guards),
            str(env.replacements), str(env.var_to_range),
            sorted(str(a.expr) for asserts in env.deferred_runtime_asserts.values()
                   for a in asserts))


def _export(model, inputs, shapes):
    with torch.no_grad():
        return torch.export.export(model, inputs, dynamic_shapes=shapes)


@pytest.mark.parametrize("name", list(CASES))
def test_the_program_is_torchs_own_whether_the_kernel_made_the_output_or_not(name, monkeypatch):
    model, inputs, shapes, made = CASES[name]
    model = model.to(inputs[0].device)
    calls = []
    for op, (made_by, keys) in list(kernels._KERNELS.items()):
        def spy(*args, made_by=made_by, **kwargs):
            output = made_by(*args, **kwargs)
            calls.append((made_by.__name__, output is not None))
            return output
        monkeypatch.setitem(kernels._KERNELS, op, (spy, keys))
    torchs = _export(model, inputs, shapes)
    assert calls == []  # off outside the block
    with kernels.shape_kernels():
        ours = _export(model, inputs, shapes)
    assert {name: {m for n, m in calls if n == name} for name in made} == made
    assert _nodes(ours) == _nodes(torchs)
    assert _shapes(ours) == _shapes(torchs)


def test_a_gpt2_block_with_a_dynamic_length_is_torchs_program():
    with torch.device("meta"):
        block = Block(GPTConfig()).eval()
    inputs, shapes = (torch.zeros(1, 16, 768, device="meta"),), ({1: SEQ},)
    torchs = _export(block, inputs, shapes)
    with kernels.shape_kernels():
        ours = _export(block, inputs, shapes)
    assert _nodes(ours) == _nodes(torchs)
    assert _shapes(ours) == _shapes(torchs)


def _rows(report) -> list:
    """Each node's record but its name (a dropped size read's number can differ)."""
    return [node.model_dump(exclude={"name"}) for node in report.nodes]


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_a_symbolic_analysis_of_gpt2_counts_as_with_torchs_composites(mode, monkeypatch):
    model, args = gpt2("meta", seq_len=16)
    shapes = ({1: Dim("seq", max=1024)},)
    ours = exportflops.analyze(model, args, dynamic_shapes=shapes, mode=mode)
    monkeypatch.setattr(exportflops.capture.export, "shape_kernels",
                        lambda: __import__("contextlib").nullcontext())
    torchs = exportflops.analyze(model, args, dynamic_shapes=shapes, mode=mode)
    assert ours.total == torchs.total
    assert _rows(ours) == _rows(torchs)
    assert ours.evaluate(seq=1024).total == torchs.evaluate(seq=1024).total


def _installed() -> dict:
    return {(op, key): op.py_kernels.get(key) for op, (_, keys) in kernels._KERNELS.items()
            for key in keys}


def test_the_kernels_are_removed_when_the_export_fails():
    before = _installed()

    class Fails(nn.Module):
        def forward(self, x):
            F.linear(x, torch.zeros(4, 16, device="meta"))
            raise RuntimeError("the model's own error")

    with pytest.raises(RuntimeError, match="the model's own error"):
        with kernels.shape_kernels():
            assert all(kernel is not None for kernel in _installed().values())
            _export(Fails(), (torch.zeros(2, 5, 16, device="meta"),), ({1: SEQ},))
    assert _installed() == before


def test_a_nested_block_leaves_the_outer_ones_kernels_in_place():
    with kernels.shape_kernels():
        outer = _installed()
        with kernels.shape_kernels():
            pass
        assert _installed() == outer
    assert not any(_installed().values())


def test_an_op_registered_twice_is_refused():
    with pytest.raises(ValueError, match="has a shape kernel already"):
        kernels.kernel(aten.linear.default)(lambda *args: None)
