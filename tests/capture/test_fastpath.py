"""The fast path (each repeated block traced once) gives the full export's report.

Equal means everything in the Report but node names (so the per-node records
are compared as a multiset without their names), forward and train. Each case also checks that
the fast path did apply (the plan has repeats), so equality is not the full export compared with
itself; and the model whose blocks differ in one shape checks that those are not merged.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from exportflops import analyze
from exportflops.capture.blocks import plan_blocks
from exportflops.capture.export import capture
from exportflops.capture.fastpath import fast_capture
from exportflops.examples.gpt2 import GPT, GPTConfig
from exportflops.examples.llama import Llama, LlamaConfig
from exportflops.examples.resnet import resnet50
from exportflops.records.symbolic import size_symbol

tf = pytest.importorskip("transformers")

D, FFN, LAYERS, HEADS, VOCAB, T = 32, 64, 3, 4, 50, 8
IDS = torch.zeros((1, T), dtype=torch.long)


class Block(nn.Module):
    """A residual linear block scaled by a buffer."""

    def __init__(self, width: int, scale_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.register_buffer("scale", torch.ones(scale_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(x) * self.scale


class Stage(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16, (16,)) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TwoStages(nn.Module):
    """Stages of 3 and 2 alike blocks, one right after the other: first.blocks.2's stub makes
    no op after first.blocks.1's, second.blocks.0's (another stack's) makes its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Stage(3), Stage(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class Runner(nn.Module):
    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return x


class RunTwice(nn.Module):
    """Four alike blocks run by one runner, three in its first call and one in its second:
    blocks.3's stub makes no op after blocks.2's, though it runs in the runner's second call.
    Its copies must not take the first call's frames (the runner ran twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16, (16,)) for _ in range(4))
        self.runner = Runner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.runner(self.runner(x, self.blocks[:3]), self.blocks[3:])


class OneShapeApart(nn.Module):
    """Four blocks alike but for block 2's scale, (1,) instead of (16,): the same output
    shapes, another mul (a broadcast of one element)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16, (1,) if i == 2 else (16,)) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def small_gpt2():
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS,
                              n_embd=D)).eval()
    return model, (torch.zeros((1, T), dtype=torch.long, device="meta"),), None


def small_llama():
    config = LlamaConfig(vocab_size=VOCAB, dim=D, n_layers=LAYERS, n_heads=HEADS,
                         n_kv_heads=2, head_dim=D // HEADS, ffn_dim=FFN, max_seq_len=T)
    with torch.device("meta"):
        model = Llama(config).eval()
    return model, (torch.zeros((1, T), dtype=torch.long, device="meta"),), None


def small_resnet():
    model, args = resnet50("meta", image_size=32)
    return model, args, None


def hf(build):
    def built():
        torch.manual_seed(0)
        return build(), (IDS,), None
    return built


HF = dict(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
          num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=VOCAB, use_cache=False)

CASES = {
    "gpt2": small_gpt2,
    "llama_example": small_llama,
    "resnet50": small_resnet,
    "hf_llama": hf(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**HF))),
    # bfloat16: Mixtral's experts run torch._grouped_mm, whose meta kernel takes bfloat16 only
    # (in float32 the cheap pass fails on meta, and the full export runs alone).
    "hf_mixtral": hf(lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
        **HF, num_local_experts=4, num_experts_per_tok=2)).to(torch.bfloat16)),
    # T5's first layer of each stack holds the relative attention bias: layers 1 and 2 repeat.
    "t5": lambda: (tf.T5ForConditionalGeneration(tf.T5Config(
        d_model=D, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS, d_kv=D // HEADS,
        vocab_size=VOCAB, use_cache=False)), (IDS,), {"decoder_input_ids": IDS}),
    "one_shape_apart": lambda: (OneShapeApart(), (torch.zeros(2, 16),), None),
    "two_stages": lambda: (TwoStages(), (torch.zeros(2, 16),), None),
    "run_twice": lambda: (RunTwice(), (torch.zeros(2, 16),), None),
}


def node_key(node) -> tuple:
    return (node.op, node.module, node.status, node.phase, node.note,
            tuple(map(repr, node.inputs)), tuple(map(repr, node.outputs)), repr(node.cost))


def assert_same_report(fast, full) -> None:
    assert fast.model_dump(exclude={"nodes", "uncounted"}) == \
        full.model_dump(exclude={"nodes", "uncounted"})
    assert Counter(map(node_key, fast.nodes)) == Counter(map(node_key, full.nodes))
    assert [(u.op, u.calls, u.modules, u.reason) for u in fast.uncounted] == \
        [(u.op, u.calls, u.modules, u.reason) for u in full.uncounted]


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_report_equals_the_full_exports(case, mode):
    model, args, kwargs = CASES[case]()
    fast = analyze(model, args, kwargs, mode=mode)
    full = analyze(model, args, kwargs, mode=mode, fast=False)
    assert_same_report(fast, full)


@pytest.mark.parametrize("case", [c for c in CASES if c != "one_shape_apart"])
def test_fast_path_applies_to_stacks_of_blocks(case):
    model, args, kwargs = CASES[case]()
    assert plan_blocks(model, args, kwargs or {}).repeats


def test_blocks_one_shape_apart_are_not_merged():
    model, args, _ = CASES["one_shape_apart"]()
    repeats = plan_blocks(model, args, {}).repeats
    # Block 0 takes the plain input (no gradient needed), the others an input that needs one
    # (computed from parameters): block 3 repeats block 1; block 2, whose scale has another
    # shape, repeats nothing and nothing repeats it.
    assert {path: r.model for path, r in repeats.items() if path.count(".") == 1} == \
        {"blocks.3": "blocks.1"}
    assert "blocks.2" not in {r.model for r in repeats.values()}


class AppendsToItsCache(nn.Module):
    """Two identical blocks, each appending its output to a cache the caller passed in."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4, bias=False) for _ in range(2))

    def forward(self, x, cache):
        for block in self.blocks:
            x = block(x)
            cache["keys"] = torch.cat([cache["keys"], x])
        return x @ cache["keys"].T


def test_the_cheap_pass_leaves_the_inputs_as_the_user_gave_them():
    # Blocks: 2 x (1 x 4 x 4) = 32 MACs; the cache given holds 3 rows, the blocks add 2, so
    # the last matmul is (1, 4) @ (4, 5): 20 MACs. A cheap pass that appended to the user's
    # cache first would leave 5 rows for the export to start from (7 at the end: 28 MACs).
    x = torch.randn(1, 4)
    report = analyze(AppendsToItsCache(), (x, {"keys": torch.randn(3, 4)}))
    assert report.total.macs == 32 + 20


SEQ = torch.export.Dim("seq", min=2, max=64)
DYNAMIC = {"gpt2": ({1: SEQ},), "llama_example": ({1: SEQ},), "hf_llama": ({1: SEQ},),
           "t5": {"input_ids": {1: SEQ}, "decoder_input_ids": {1: SEQ}}}


def _exports(monkeypatch) -> list:
    """The targets `analyze` hands to torch.export, in order."""
    import exportflops.api
    import exportflops.capture.fastpath

    targets, capture = [], exportflops.api.capture

    def spied(target, *args, **kwargs):
        targets.append(target)
        return capture(target, *args, **kwargs)
    monkeypatch.setattr(exportflops.api, "capture", spied)
    monkeypatch.setattr(exportflops.capture.fastpath, "capture", spied)
    return targets


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("case", list(DYNAMIC))
def test_fast_path_with_dynamic_shapes_equals_the_full_export(case, mode, monkeypatch):
    model, args, kwargs = CASES[case]()
    targets = _exports(monkeypatch)
    fast = analyze(model, args, kwargs, mode=mode, dynamic_shapes=DYNAMIC[case])
    assert len(targets) == 1 and targets[0] is not model  # the stubbed copy, exported alone
    full = analyze(model, args, kwargs, mode=mode, dynamic_shapes=DYNAMIC[case], fast=False)
    assert [s.name for s in fast.symbols] == ["seq"]
    assert_same_report(fast, full)


class AlikeAtTheExample(nn.Module):
    """Two identical linear blocks: one on x (1, seq, 16), one on y (1, 16, 16). At the example
    seq = 16 their calls are alike; as functions of seq they are not."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x, y):
        return self.blocks[0](x).sum() + self.blocks[1](y).sum()


def test_blocks_alike_only_at_the_example_sizes_are_traced_in_full(monkeypatch):
    model, x, y = AlikeAtTheExample(), torch.randn(1, 16, 16), torch.randn(1, 16, 16)
    assert plan_blocks(model, (x, y), {}).repeats  # the cheap pass sees one shape
    targets = _exports(monkeypatch)
    report = analyze(model, (x, y), dynamic_shapes=({1: SEQ}, None))
    assert targets[-1] is model  # the stubbed export refused the repeat: the full export ran
    # Linear(16, 16) on seq rows: 16 x 16 MACs per row; on y's 16 rows: 16 x 16 x 16.
    seq = size_symbol("seq")
    assert report.total.macs - (256 * seq + 4096) == 0


class Residual(nn.Module):
    """x + linear(x); with ``reads_size`` it also reshapes by its input's sizes, as attention
    splits heads."""

    def __init__(self, reads_size: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.reads_size = reads_size

    def forward(self, x):
        y = self.linear(x)
        if self.reads_size:
            batch, seq, width = x.shape
            y = y.reshape(batch * seq, width).reshape(batch, seq, width)
        return x + y


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("reads_size", [False, True], ids=["reads_no_size", "reads_its_size"])
def test_a_dynamic_size_gives_the_fast_path_the_full_exports_operators(reads_size, mode,
                                                                       monkeypatch):
    model = nn.Sequential(*(Residual(reads_size) for _ in range(3)))
    x = torch.randn(1, 8, 16)
    targets = _exports(monkeypatch)
    fast = analyze(model, (x,), mode=mode, dynamic_shapes=({1: SEQ},))
    assert len(targets) == 1 and targets[0] is not model  # the stubbed copy, exported alone
    full = analyze(model, (x,), mode=mode, dynamic_shapes=({1: SEQ},), fast=False)
    # Before: the stubs' zeros read seq from the input, a sym_size row the full export lacks.
    assert fast.by_operator() == full.by_operator()
    assert_same_report(fast, full)
    if mode == "forward" and not reads_size:
        # Three blocks, each one linear and one residual add; no size is read.
        assert {op: row.calls for op, row in fast.by_operator().items()} == \
            {"aten.linear.default": 3, "aten.add.Tensor": 3}


def _zeros(program, outside: dict) -> int:
    """The program's ``aten.zeros`` nodes outside every module path in ``outside``."""
    return sum(1 for node in program.graph.nodes
               if node.target is torch.ops.aten.zeros.default
               and not any(path in outside for path, _ in
                           node.meta.get("nn_module_stack", {}).values()))


def test_forward_stubs_export_one_op_for_all_their_outputs_and_a_run_of_them():
    # The Llama example's block returns three tensors (its output, its key and its value): a
    # stub of one op (zeros of the first) for all three. Layers 1 and 2 repeat layer 0 one
    # right after the other: layer 2's stub makes no op, layer 1's zeros stand for both. The
    # final norm repeats layer 0's first norm: one zeros. So 2 zeros beside the model's own
    # (those of the full export outside the repeated blocks).
    model, args, _ = small_llama()
    repeats = plan_blocks(model, args, {}).repeats
    stubbed, expansion = fast_capture(model, args, None, train=False)
    own = _zeros(capture(model, args, forward_only=True).program, repeats)
    assert {path: r.model for path, r in repeats.items()} == \
        {"layers.1": "layers.0", "layers.2": "layers.0", "norm": "layers.0.attention_norm"}
    assert expansion.after == {"layers.1": "layers.2"}
    assert _zeros(stubbed.program, {}) == own + 2
