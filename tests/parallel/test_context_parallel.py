"""Context parallelism (`analyze_context`, ``--cp N``): each rank's causal attention pairs, its
FLOPs and its ring key/value traffic, every number derived by hand below.

The model: token ids -> embedding (8 channels) -> one linear to q, k, v -> one causal
``scaled_dot_product_attention`` over 2 heads of 4 channels. Per token the linear is 8 x 24 = 192
MACs (384 FLOPs). Per (query, key) pair and head, exportflops' attention formula
(formulas/attention.py: q.k over the head dim and p.v over it, plus per score the scale 1, the
softmax 5 and the causal mask 1) counts 4 + 4 = 8 MACs and 2 x 8 + 7 = 23 FLOPs; over 2 heads
16 MACs and 46 FLOPs per pair.

Causal pairs of queries start .. stop - 1 over every key j <= i: the sum of i + 1. For T = 16:
- round-robin, cp = 2, 4 chunks of 4: rank 0 holds positions 0-3 and 12-15:
  (1 + 2 + 3 + 4) + (13 + 14 + 15 + 16) = 10 + 58 = 68; rank 1 holds 4-7 and 8-11:
  (5 + 6 + 7 + 8) + (9 + 10 + 11 + 12) = 26 + 42 = 68. In ring blocks: rank 0's chunk 3 sees
  3 full 4 x 4 blocks and its diagonal, 3 x 16 + 10 = 58.
- contiguous, cp = 2, blocks of 8: rank 0 1 + ... + 8 = 36, rank 1 9 + ... + 16 = 100.
All ranks together: 16 x 17 / 2 = 136 = 68 + 68 = 36 + 100.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from exportflops.cli import main
from exportflops.errors import InputError
from exportflops.parallel.context import analyze_context
from exportflops.records.context import ContextParallelReport
from tests.cli_support import one_paragraph

HEADS, HEAD_DIM, DIM = 2, 4, 8
T = 16
LINEAR_MACS_PER_TOKEN = DIM * 3 * DIM  # 8 x 24 = 192
PAIR_MACS = HEADS * (HEAD_DIM + HEAD_DIM)  # 16: q.k and p.v
PAIR_FLOPS = HEADS * (2 * (HEAD_DIM + HEAD_DIM) + 1 + 5 + 1)  # 46: + scale, softmax, mask
F32 = 4


class CausalAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, L = ids.shape
        qkv = self.qkv(self.embed(ids)).view(B, L, 3, HEADS, HEAD_DIM)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, H, L, hd)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class NoAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


def ids(batch: int = 1, length: int = T) -> torch.Tensor:
    return torch.zeros(batch, length, dtype=torch.long)


def test_round_robin_ranks_attend_to_equal_pairs_and_do_equal_work():
    r = analyze_context(CausalAttention(), (ids(),), cp=2)
    assert [[(c.start, c.stop) for c in rank.chunks] for rank in r.ranks] == [
        [(0, 4), (12, 16)], [(4, 8), (8, 12)]]
    assert [rank.attention_pairs for rank in r.ranks] == [68, 68]
    assert [rank.attention_flops for rank in r.ranks] == [68 * 46, 68 * 46]  # 3128 each
    assert [rank.attention_macs for rank in r.ranks] == [68 * 16, 68 * 16]
    # Each rank's 8 tokens through the linear: 8 x 192 MACs, 8 x 384 FLOPs.
    assert [rank.other_macs for rank in r.ranks] == [8 * 192, 8 * 192]
    assert [rank.other_flops for rank in r.ranks] == [8 * 384, 8 * 384]
    assert r.imbalance == 1.0 and r.load_balanced


def test_contiguous_blocks_leave_the_last_rank_the_most_attention():
    r = analyze_context(CausalAttention(), (ids(),), cp=2, load_balance=False)
    assert [[(c.start, c.stop) for c in rank.chunks] for rank in r.ranks] == [[(0, 8)],
                                                                             [(8, 16)]]
    assert [rank.attention_pairs for rank in r.ranks] == [36, 100]
    assert [rank.attention_flops for rank in r.ranks] == [36 * 46, 100 * 46]  # 1656, 4600
    assert r.busiest.rank == 1
    # Busiest over the mean: (3072 + 4600) / ((3072 + 1656 + 3072 + 4600) / 2) = 7672 / 6200.
    assert r.imbalance == pytest.approx(7672 / 6200)


@pytest.mark.parametrize("load_balance", [True, False], ids=["round-robin", "contiguous"])
def test_four_ranks_split_the_pairs_by_hand(load_balance):
    r = analyze_context(CausalAttention(), (ids(),), cp=4, load_balance=load_balance)
    if load_balance:
        # 8 chunks of 2; rank r holds chunks r and 7 - r: 7 full 2 x 2 blocks below the
        # diagonal (7 x 4 = 28) and two diagonals of 3 pairs each: 34 for every rank.
        expected = [34, 34, 34, 34]
    else:
        # Blocks of 4: (1+2+3+4), (5+...+8), (9+...+12), (13+...+16).
        expected = [10, 26, 42, 58]
    assert [rank.attention_pairs for rank in r.ranks] == expected
    assert sum(expected) == 16 * 17 // 2


def test_the_ranks_add_up_to_the_single_device_causal_count():
    # Single device: 16 tokens x 384 + 136 causal pairs x 46 = 6144 + 6256.
    for load_balance in (True, False):
        r = analyze_context(CausalAttention(), (ids(),), cp=2, load_balance=load_balance)
        assert r.single_device_flops == 16 * 384 + 136 * 46
        assert sum(rank.flops for rank in r.ranks) == r.single_device_flops


def test_forward_ring_sends_the_key_value_shard_once_per_other_rank():
    r = analyze_context(CausalAttention(), (ids(batch=2),), cp=2)
    # K and V of 2 rows x 2 heads x 8 local positions x 4 channels, float32:
    # 2 x 2 x 2 x 8 x 4 x 4 = 1024 bytes per send; cp - 1 = 1 send per attention forward.
    for rank in r.ranks:
        assert [(s.phase, s.tensors, s.sends, s.bytes, s.dtype) for s in rank.sends] == [
            ("forward", "key/value", 1, 2 * 2 * 2 * 8 * 4 * F32, "float32")]
        assert (rank.sends[0].to_rank, rank.sends[0].from_rank) == ((rank.rank + 1) % 2,) * 2
    assert [c.op for c in r.collectives(1)] == ["send"]
    assert r.collectives(1)[0].bytes == 1024 and r.collectives(1)[0].mesh_dim == "cp"


def test_train_mode_counts_the_backward_and_its_ring_in_bfloat16():
    model = CausalAttention().to(torch.bfloat16)
    r = analyze_context(model, (ids(),), cp=4, mode="train")
    # Backward per pair: four contractions (dq, dk from the scores' gradient; dv, dp) = 2 x 16
    # MACs; forward 16: 48 MACs per pair, 34 pairs per rank.
    assert r.macs_per_pair == 16 + 2 * 16
    assert [rank.attention_macs for rank in r.ranks] == [34 * 48] * 4
    # The linear forward 192 MACs per token, backward its input and weight gradients 2 x 192;
    # 4 tokens per rank.
    assert [rank.other_macs for rank in r.ranks] == [4 * 3 * 192] * 4
    assert len({rank.flops for rank in r.ranks}) == 1
    assert sum(rank.flops for rank in r.ranks) == r.single_device_flops
    assert all(0 < rank.backward_flops < rank.flops for rank in r.ranks)
    # K/V shard: 2 heads x 4 positions x 4 channels, twice (K and V): 64 elements. Forward
    # 3 sends in bfloat16 (2 bytes); backward the shard 3 sends again, and its gradients 4
    # sends (back to their owner) in float32, as torch's ring backward accumulates them.
    assert [(s.phase, s.tensors, s.sends, s.bytes, s.dtype) for s in r.ranks[2].sends] == [
        ("forward", "key/value", 3, 64 * 2, "bfloat16"),
        ("backward", "key/value", 3, 64 * 2, "bfloat16"),
        ("backward", "key/value gradients", 4, 64 * 4, "float32")]
    assert r.ranks[2].send_bytes == 3 * 128 + 3 * 128 + 4 * 256


def test_the_record_round_trips_through_json():
    r = analyze_context(CausalAttention(), (ids(),), cp=2, mode="train")
    assert ContextParallelReport.model_validate_json(r.model_dump_json()) == r


@pytest.mark.parametrize(("model", "kwargs", "says"), [
    (CausalAttention, {"cp": 1}, "cp >= 2"),
    (CausalAttention, {"cp": 3}, "multiple of 6"),  # 16 positions, 2 x 3 chunks
    (NoAttention, {"cp": 2}, "scaled_dot_product_attention"),
], ids=["one rank", "uneven chunks", "no attention"])
def test_splits_that_cannot_be_made_are_refused_with_the_fix(model, kwargs, says):
    with pytest.raises(InputError, match=says):
        analyze_context(model(), (ids(),), **kwargs)


# --- the command ---------------------------------------------------------------------------------

def test_the_built_in_llama_on_a_ring_of_two_and_the_command_prints_its_record(capsys):
    from exportflops.examples.llama import llama
    from exportflops.parallel import Layout, analyze_ranks

    model, _ = llama("meta")  # as the command builds it, on 256 token ids (--input 1,256:int64)
    r = analyze_ranks(model, (torch.zeros(1, 256, dtype=torch.long, device="meta"),),
                      layout=Layout(cp=2))
    # 256 positions in 4 chunks of 64: rank 1 holds 64-127 and 128-191:
    # (65 + ... + 128) + (129 + ... + 192) = 6176 + 10272 = 16448 = 256 x 257 / 4.
    assert (r.cp, r.seq_len, r.load_balanced) == (2, 256, True)
    assert r.ranks[1].attention_pairs == 6176 + 10272 == 256 * 257 // 4
    assert r.ranks[0].flops == r.ranks[1].flops
    assert main(["llama", "--cp", "2", "--rank", "1", "--input", "1,256:int64"]) == 0
    text = capsys.readouterr().out
    assert "Ring traffic of rank 1 of 2" in text and "Every rank does the same work." in text


@pytest.mark.parametrize("args", [
    ["--cp", "2", "--rank", "2"],
    ["--cp", "1"],
    ["--cp", "2", "--tp", "2", "--rank", "4"],
    ["--no-load-balance"],
    ["--cp", "2", "--format", "csv"],
    ["--cp", "3", "--input", "1,64:int64"],  # 64 positions do not split in 6 chunks
], ids=["rank past the ring", "one rank", "rank past cp x tp", "no cp", "csv", "uneven chunks"])
def test_the_command_refuses_what_it_cannot_split_in_one_line(capsys, args):
    assert main(["llama", *args]) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip(), stderr
