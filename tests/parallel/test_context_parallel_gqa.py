"""Context parallelism on grouped-query attention: the ring sends the key/value heads the eager
``scaled_dot_product_attention`` call receives, which under export a transformers model repeats
to the query heads (`exportflops.graph.eager_heads`); every number derived by hand below.

The model: a Hugging Face Llama of 2 layers, hidden size 32, 4 query heads and 2 key/value
heads of head dim 8. transformers' ``sdpa_attention_forward`` (integrations/sdpa_attention.py)
calls SDPA on the 2 key/value heads with ``enable_gqa=True`` when there is no mask
(``use_gqa_in_sdpa``); eager skips the causal mask of an unpadded batch, export builds it
(masking_utils' ``_ignore_causal_mask_sdpa`` returns False when exporting) and so repeats the
heads (``repeat_kv``) to 4. torch's ``context_parallel`` wraps the eager SDPA call, so its ring
sends what that call receives (its flash kernel takes the 2 heads: GQA "works only for
Flash_attention and math kernel on CUDA", torch's SDPA docstring).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from exportflops import analyze
from exportflops.parallel.context import analyze_context

transformers = pytest.importorskip("transformers")

B, T, CP = 2, 16, 2
LOCAL = T // CP  # 8 positions per rank
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 8, 2
F32 = 4
# K and V of (B, kv heads, T / cp, head dim), float32: 2 x 2 x 2 x 8 x 8 x 4 = 2048 bytes.
EAGER_KV_SEND = 2 * B * KV_HEADS * LOCAL * HEAD_DIM * F32
REPEATED_KV_SEND = 2 * B * HEADS * LOCAL * HEAD_DIM * F32  # the graph's 4 heads: 4096


def llama(head_dim: int = HEAD_DIM, heads: int = HEADS, kv_heads: int = KV_HEADS):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def ids() -> torch.Tensor:
    return torch.zeros(B, T, dtype=torch.long)


class SdpaCalls(TorchFunctionMode):
    """The key/value shapes and keyword arguments of each eager SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append((tuple(args[1].shape), tuple(args[2].shape),
                               kwargs.get("enable_gqa", False), kwargs.get("attn_mask")))
        return func(*args, **kwargs)


def eager_sdpa_calls(model) -> list:
    with torch.no_grad(), SdpaCalls() as calls:
        model(ids(), use_cache=False)
    return calls.calls


@pytest.fixture(scope="module")
def gqa():
    return llama()


def test_eager_transformers_passes_sdpa_the_key_value_heads_as_they_are(gqa):
    # The premise of the rule: (B, 2 kv heads, T, 8), enable_gqa=True, no mask, per layer.
    assert eager_sdpa_calls(gqa) == [((B, KV_HEADS, T, HEAD_DIM),) * 2 + (True, None)] * LAYERS


def test_the_ring_sends_the_key_value_heads_the_eager_call_receives(gqa):
    r = analyze_context(gqa, (ids(),), cp=CP)
    for rank in r.ranks:
        assert [(s.module, s.sends, s.bytes) for s in rank.sends] == [
            (f"model.layers.{i}.self_attn", CP - 1, EAGER_KV_SEND) for i in range(LAYERS)]
    assert EAGER_KV_SEND == REPEATED_KV_SEND // 2  # 4 query heads over 2 key/value heads


def test_in_training_the_backward_ring_and_its_gradients_carry_the_key_value_heads(gqa):
    r = analyze_context(gqa, (ids(),), cp=CP, mode="train")
    # Backward: the shard again (cp - 1 sends), and its gradients (cp sends) in float32.
    assert [(s.phase, s.tensors, s.sends, s.bytes) for s in r.ranks[1].sends[:3]] == [
        ("forward", "key/value", 1, EAGER_KV_SEND), ("backward", "key/value", 1, EAGER_KV_SEND),
        ("backward", "key/value gradients", 2, EAGER_KV_SEND)]


def test_the_mask_export_builds_is_counted_as_four_ops_per_pair_and_not_sent(gqa):
    r = analyze_context(gqa, (ids(),), cp=CP)
    # Per (query, key) pair of a row: SDPA's 4 heads x (2 x (8 + 8) + 1 scale + 5 softmax + 1
    # mask) = 156 per layer, and the mask export materializes over (batch, 1, seq, seq): le,
    # and, eq, and, 1 FLOP each (eager skips it: the difference, 4 of 316). The ring sends no
    # mask: only key/value messages.
    assert r.flops_per_pair == LAYERS * HEADS * (2 * (HEAD_DIM + HEAD_DIM) + 7) + 4
    assert {s.tensors for s in r.ranks[0].sends} == {"key/value"}


def test_the_single_device_record_names_the_eager_inputs_and_counts_the_graphs_bytes(gqa):
    report = analyze(gqa, (ids(),))
    calls = [n for n in report.nodes if n.op == "aten.scaled_dot_product_attention.default"]
    assert len(calls) == LAYERS
    for call in calls:
        assert [t.shape for t in call.eager_inputs] == [
            [B, HEADS, T, HEAD_DIM], [B, KV_HEADS, T, HEAD_DIM], [B, KV_HEADS, T, HEAD_DIM]]
        assert "enable_gqa=True" in call.note
        # As the graph runs it: q, the repeated k and v (B x 4 x T x 8 x 4 bytes each) and the
        # bool mask (B x T x T): 3 x 4096 + 512.
        assert call.cost.bytes_read == 3 * B * HEADS * T * HEAD_DIM * F32 + B * T * T


def test_a_symbolic_record_evaluates_its_eager_inputs(gqa):
    from exportflops.training import flops_per_batch

    fpb = flops_per_batch(gqa, (ids(),), mode="forward")
    call = next(n for n in fpb.report.evaluate(batch=3, seq=10).nodes
                if n.op == "aten.scaled_dot_product_attention.default")
    assert call.eager_inputs[1].shape == [3, KV_HEADS, 10, HEAD_DIM]


def test_over_256_channels_a_head_transformers_repeats_eagerly_too_and_the_ring_sends_them():
    model = llama(head_dim=264, heads=2, kv_heads=1)
    # use_gqa_in_sdpa: a head dim over 256 takes repeat_kv in eager as well.
    assert eager_sdpa_calls(model)[0][:3] == ((B, 2, T, 264), (B, 2, T, 264), False)
    r = analyze_context(model, (ids(),), cp=CP)
    assert r.ranks[0].sends[0].bytes == 2 * B * 2 * LOCAL * 264 * F32  # 2 query heads: 67584


class RepeatsItsOwnHeads(nn.Module):
    """Grouped-query attention whose own code repeats the key/value heads (as exportflops'
    built-in Llama does): eager passes SDPA the 4 repeated heads too."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.q = nn.Linear(32, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(32, 2 * KV_HEADS * HEAD_DIM, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        x = self.embed(ids)
        q = self.q(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = (t.transpose(1, 2) for t in self.kv(x).view(b, n, 2, KV_HEADS, HEAD_DIM).unbind(2))
        rep = HEADS // KV_HEADS
        k, v = (t[:, :, None].expand(b, KV_HEADS, rep, n, HEAD_DIM).reshape(b, HEADS, n, HEAD_DIM)
                for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_a_model_that_repeats_its_own_heads_sends_the_repeated_heads():
    r = analyze_context(RepeatsItsOwnHeads(), (ids(),), cp=CP)
    assert [s.bytes for s in r.ranks[0].sends] == [REPEATED_KV_SEND]


def test_with_tensor_parallelism_each_rank_sends_its_share_of_the_key_value_heads(gqa, tmp_path):
    from exportflops.cli.ranks import analyze_split
    from exportflops.cli.options import check, parser

    gqa.config.save_pretrained(tmp_path)
    ns = parser().parse_args([f"hf:{tmp_path / 'config.json'}", "--layers", "1", "--batch",
                              str(B), "--seq", str(T), "--cp", str(CP), "--tp", "2"])
    check(ns)
    record = analyze_split(ns).record
    # Each of tp = 2 ranks holds 1 of the 2 key/value heads (2 of the 4 query heads):
    # 2 x B x 1 x 8 x 8 x 4 = 1024 bytes, where the rank's graph repeats it to 2 heads.
    assert [[s.bytes for s in rank.sends] for rank in record.ranks] == [
        [2 * B * 1 * LOCAL * HEAD_DIM * F32]] * 4
