"""A tensor-parallel degree a Hugging Face model's plan cannot split is refused by name before
any rank runs (`exportflops.parallel.shard_sizes`): part of a head per rank, as torchtitan
refuses it (``update_from_config``: tp must divide n_heads and n_kv_heads), or a shard shorter
than another. A tiny Llama: 4 query heads and 2 key/value heads of head_dim 8 (hidden 32),
so k_proj and v_proj have 2 x 8 = 16 output features, which 4 ranks would split into 4
features each, half a head."""

from __future__ import annotations

import pytest
import torch

from exportflops.cli import main
from exportflops.errors import LayoutError
from exportflops.parallel import Layout, analyze_ranks, memory_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
transformers = pytest.importorskip("transformers")

SEQ, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 8, 32, 4, 2, 8


def _config(vocab: int = 64) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        max_position_embeddings=64, tie_word_embeddings=False)


def _llama(vocab: int = 64):
    def build(device: torch.device):
        with device:
            model = transformers.LlamaForCausalLM(_config(vocab))
        ids = torch.zeros(1, SEQ, dtype=torch.long, device=device)
        return model, (ids,), {"use_cache": False}
    return build


@pytest.mark.parametrize("analysis", [analyze_ranks, memory_ranks],
                         ids=["analyze_ranks", "memory_ranks"])
def test_four_ranks_over_two_key_value_heads_are_refused_naming_the_projection(analysis):
    with pytest.raises(LayoutError) as caught:
        analysis(_llama(), layout=Layout(tp=4), rank=0)
    message = str(caught.value)
    assert message.startswith("tp=4: LlamaForCausalLM's tensor-parallel plan splits ")
    # 2 kv heads x head_dim 8 = 16 output features; one entry for every layer's copy.
    assert ("model.layers.*.self_attn.k_proj.weight: dimension 0 (16) holds 2 heads of "
            "head_dim 8, and a rank holds whole heads") in message
    assert "model.layers.*.self_attn.v_proj.weight: dimension 0 (16)" in message
    # The degrees dividing both head counts (4 and 2) and every width split (64): 1 and 2.
    assert message.endswith("divides every size the plan splits: tp=1 or tp=2.")


def test_two_ranks_each_hold_one_key_value_head_and_count_its_projection():
    report = analyze_ranks(_llama(), layout=Layout(tp=2), rank=1)
    # k_proj column-parallel: SEQ rows x HIDDEN inputs x (2 heads x 8) / 2 outputs per rank.
    assert report.module("model.layers.0.self_attn.k_proj").inclusive.macs == \
        SEQ * HIDDEN * (KV_HEADS * HEAD_DIM // 2) == 2048


def test_a_vocabulary_two_ranks_split_unevenly_is_refused_naming_the_embedding_and_head():
    with pytest.raises(LayoutError) as caught:
        analyze_ranks(_llama(vocab=65), layout=Layout(tp=2), rank=0)
    message = str(caught.value)
    # transformers would give rank 0 33 rows and rank 1 32; a rank's capture needs equal ones.
    for weight in ("model.embed_tokens.weight", "lm_head.weight"):
        assert f"{weight}: dimension 0 (65) would split unevenly" in message
    assert "torchtitan" not in message  # no head is split
    # 65 = 5 x 13 shares no divisor but 1 with the 4 and 2 heads.
    assert message.endswith(": tp=1.")


def test_the_command_refuses_the_degree_by_its_flag(tmp_path, capsys):
    _config().to_json_file(tmp_path / "config.json")
    assert main([f"hf:{tmp_path / 'config.json'}", "--tp", "4", "--seq", str(SEQ)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("exportflops: error: --tp 4: LlamaForCausalLM's tensor-parallel")
    assert error.rstrip().endswith("--tp 1 or --tp 2.")


def test_the_built_in_llamas_plan_refuses_a_degree_its_heads_do_not_take_by_its_flag(capsys):
    # The built-in llama is Llama 3 8B: 32 query heads and 8 key/value heads (LLAMA3_8B,
    # exportflops/examples/llama.py); 3 divides neither.
    assert main(["llama", "--tp", "3"]) == 2
    assert capsys.readouterr().err.startswith(
        "exportflops: error: --tp 3: the Llama plan gives each rank whole heads, and 3 does not "
        "divide n_heads (32) and n_kv_heads (8): pass --tp a divisor of 8.")


class _Attention(torch.nn.Module):
    """Three heads of head_dim 4 (q: 8 -> 12 features), as a model with its own plan has them."""

    head_dim = 4

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 3 * self.head_dim)
        self.o = torch.nn.Linear(3 * self.head_dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = self.q(x).view(*x.shape[:-1], -1, self.head_dim)  # (B, heads, head_dim)
        return self.o(heads.flatten(-2))


def test_a_models_own_plan_that_splits_three_heads_two_ways_is_refused_too():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = torch.nn.Sequential(_Attention()).to("meta")
    model.tp_plan = {"0.q": ColwiseParallel(), "0.o": RowwiseParallel()}
    with pytest.raises(LayoutError) as caught:
        analyze_ranks(model, (torch.randn(2, 8, device="meta"),), layout=Layout(tp=2))
    # q's 12 output features and o's 12 input features are 3 heads of 4: 3 is odd.
    for weight, dim in (("0.q.weight", 0), ("0.o.weight", 1)):
        assert f"{weight}: dimension {dim} (12) holds 3 heads of head_dim 4" in str(caught.value)
    assert "0.q.bias: dimension 0 (12) holds 3 heads" in str(caught.value)
    # The degrees dividing 3 heads (o's bias is replicated, no other size is split): 1 and 3.
    assert str(caught.value).endswith(": tp=1 or tp=3.")
