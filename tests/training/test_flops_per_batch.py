"""flops_per_batch: each step's FLOPs from one analysis, checked against published formulas
derived here and against separate analyses at fixed sizes."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn
from torch.export import Dim
from torch.utils.checkpoint import checkpoint

import exportflops
from exportflops.errors import InputError

transformers = pytest.importorskip("transformers")

# A tiny Llama (dense, grouped-query attention).
L, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2, 64, 4, 2, 16, 128, 128


def _llama_config(**overrides):
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=L,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
        use_cache=False, **overrides)


@functools.lru_cache(maxsize=None)
def _llama_fpb():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config())
    return exportflops.flops_per_batch(model, (torch.randint(0, VOCAB, (2, 16)),))


# The 2-D (matmul) weights, embedding excluded: q, k, v, o, gate, up, down per layer and the
# untied LM head. torchtitan's N also holds the norms' weights, which do no matmul work.
MATMUL_PARAMS = (L * (HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM
                      + HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * FFN)
                 + HIDDEN * VOCAB)


def torchtitan_flops_per_token(seq: int) -> int:
    """torchtitan's ``get_num_flop_per_token``: 6N for the matmuls (forward 2, backward 4),
    12 L H Q T for attention's two contractions (q.k and p.v, each 2 FLOPs per MAC, times 3
    for the step), dense over the T x T scores.
    https://github.com/pytorch/torchtitan/blob/main/torchtitan/models/utils.py"""
    return 6 * MATMUL_PARAMS + 12 * L * HEADS * HEAD_DIM * seq


@pytest.mark.parametrize("batch,seq", [(1, 7), (3, 40), (8, 128)], ids=["1x7", "3x40", "8x128"])
def test_a_llama_steps_matmul_flops_equal_torchtitans_formula_at_any_size(batch, seq):
    step = _llama_fpb().step(torch.zeros(batch, seq, dtype=torch.long))
    assert step.matmul_flops == batch * seq * torchtitan_flops_per_token(seq)
    assert step.tokens == batch * seq and step.padded_tokens == 0


@pytest.mark.parametrize("lengths", [[5], [10, 20, 30], [1, 1, 64, 3]],
                         ids=["one", "three", "four"])
def test_a_packed_row_equals_verls_dense_formula_with_the_sum_of_squared_lengths(lengths):
    """verl's ``estimate_flops`` (verl/utils/flops_counter.py): 6 N tokens + 12 x sum(L_i^2) x
    head_dim x heads x layers, with N its dense parameters (here the matmul weights)."""
    step = _llama_fpb().step(seqlens=lengths)
    verl = (6 * MATMUL_PARAMS * sum(lengths)
            + 12 * sum(n * n for n in lengths) * HEAD_DIM * HEADS * L)
    assert step.matmul_flops == verl
    assert [d.length for d in step.documents] == lengths


def test_calling_it_returns_the_steps_model_flops_as_a_fresh_analysis_counts_them():
    fpb = _llama_fpb()
    ids = torch.zeros(3, 24, dtype=torch.long)
    model = transformers.LlamaForCausalLM(_llama_config())
    fresh = exportflops.analyze(model, (ids,), mode="train")
    assert fpb(ids) == fresh.total.flops == fpb.step(ids).model_flops


def test_position_ids_that_restart_mark_packed_documents_as_seqlens_does():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config())
    fpb = exportflops.flops_per_batch(model, (), {
        "input_ids": torch.zeros(2, 16, dtype=torch.long),
        "position_ids": torch.arange(16).repeat(2, 1)})
    positions = torch.cat([torch.arange(n) for n in (6, 10, 4)]).unsqueeze(0)
    ids = torch.zeros(1, 20, dtype=torch.long)
    by_positions = fpb.step(input_ids=ids, position_ids=positions)
    assert by_positions.model_flops == fpb.step(seqlens=[6, 10, 4]).model_flops
    assert [d.length for d in by_positions.documents] == [6, 10, 4]


def _flattened(lengths):
    """A batch as transformers' DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    writes it: one row, positions restarting per document, flash attention's offsets."""
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    return {"input_ids": torch.zeros(1, sum(lengths), dtype=torch.long),
            "position_ids": torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0),
            "cu_seq_lens_q": offsets, "cu_seq_lens_k": offsets,
            "max_length_q": max(lengths), "max_length_k": max(lengths)}


@functools.lru_cache(maxsize=None)
def _flattened_llama_fpb():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config())
    return exportflops.flops_per_batch(model, (), _flattened([10, 14]))


def test_a_llama_batch_with_flash_attentions_offsets_counts_each_document_on_cpu():
    """SDPA on cpu; the offsets give the documents, each at verl's per-document formula."""
    lengths = [6, 20, 4]
    step = _flattened_llama_fpb().step(**_flattened(lengths))
    assert [d.length for d in step.documents] == lengths
    assert step.matmul_flops == (6 * MATMUL_PARAMS * sum(lengths)
                                 + 12 * sum(n * n for n in lengths) * HEAD_DIM * HEADS * L)


def test_offsets_that_end_before_the_row_are_refused():
    batch = _flattened([10, 14])
    batch["cu_seq_lens_q"] = torch.tensor([0, 10, 20], dtype=torch.int32)
    with pytest.raises(InputError, match="one packed row of 20 tokens, and the batch's ids "
                                         "are 1 x 24"):
        _flattened_llama_fpb()(**batch)


def test_offsets_for_a_flash_attention_model_are_refused_naming_the_sdpa_route():
    model = transformers.LlamaForCausalLM(_llama_config())
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(InputError, match="flash_attention_2 .* attn_implementation='sdpa'"):
        exportflops.flops_per_batch(model, (), _flattened([10, 14]))


class Attention(nn.Module):
    """Token embedding, a causal self-attention and a head: every term of its step scales with
    the batch (no per-step constant), so a packed row is exactly its documents' sum."""

    def __init__(self, vocab=32, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, vocab)

    def forward(self, ids, attention_mask=None):
        b, t = ids.shape
        q, k, v = self.qkv(self.embed(ids)).view(b, t, 3, self.heads, -1).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


@functools.lru_cache(maxsize=None)
def _separate(length: int, batch: int = 1) -> int:
    """A separate analysis of a step at fixed sizes: no flops_per_batch involved."""
    torch.manual_seed(0)
    report = exportflops.analyze(Attention(), (torch.zeros(batch, length, dtype=torch.long),),
                                 mode="train")
    return report.total.flops


@functools.lru_cache(maxsize=None)
def _attention_fpb():
    torch.manual_seed(0)
    ids = torch.zeros(2, 9, dtype=torch.long)
    return exportflops.flops_per_batch(Attention(), (ids,),
                                       {"attention_mask": torch.ones_like(ids)})


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(min_value=2, max_value=12), min_size=1, max_size=4))
def test_a_packed_row_counts_the_sum_of_its_documents_separate_analyses(lengths):
    step = _attention_fpb().step(seqlens=lengths)
    assert step.model_flops == sum(_separate(n) for n in lengths)
    assert sum(d.flops for d in step.documents) == step.model_flops


def test_a_padded_batch_counts_executed_with_the_padding_and_model_flops_without():
    lengths = [9, 5, 2]
    mask = torch.tensor([[1] * n + [0] * (9 - n) for n in lengths])
    step = _attention_fpb().step(torch.zeros(3, 9, dtype=torch.long), attention_mask=mask)
    assert step.executed_flops == _separate(9, batch=3)
    assert step.model_flops == sum(_separate(n) for n in lengths)
    assert step.tokens == 16 and step.padded_tokens == 27 - 16
    assert _attention_fpb()(torch.zeros(3, 9, dtype=torch.long),
                            attention_mask=mask) == step.model_flops


class LoopedExperts(nn.Module):
    """Top-k routing to experts picked with ``torch.where``: each expert's token count is
    read from the routing's values (a data-dependent size)."""

    def __init__(self, d=16, h=32, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, h, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(h, d, bias=False) for _ in range(experts))

    def forward(self, x):
        b, t, d = x.shape
        x = x.reshape(-1, d)
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.k, dim=-1)
        out = torch.zeros_like(x)
        for e in range(len(self.w1)):
            token, slot = torch.where(chosen == e)
            y = self.w2[e](torch.relu(self.w1[e](x[token]))) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out.reshape(b, t, d)


@pytest.mark.parametrize("seed", [0, 1], ids=["routing-a", "routing-b"])
def test_routed_experts_count_top_k_experts_per_token_whatever_the_routing(seed):
    torch.manual_seed(seed)
    model = LoopedExperts()
    fpb = exportflops.flops_per_batch(model, (torch.randn(2, 8, 16),), dynamic_shapes=(
        {0: Dim("batch"), 1: Dim("seq")},))
    # Per token: the router's weight gradient and forward (its input needs no gradient):
    # 2 x (2 d e); per routed slot (k of them): w1 forward and weight gradient 2 x (2 d h),
    # w2 forward, input and weight gradients 3 x (2 h d).
    d, h, e, k = 16, 32, 4, 2
    per_token = 2 * (2 * d * e) + k * (2 * (2 * d * h) + 3 * (2 * h * d))
    torch.manual_seed(seed + 10)
    assert fpb.step(torch.randn(3, 5, 16)).matmul_flops == 3 * 5 * per_token


# A Mixtral never checkpoints: its failing eager run on fake tensors must not warn that a
# recompute is left out.
@pytest.mark.filterwarnings("error:.*did not run eagerly")
def test_a_mixtral_steps_matmul_flops_count_top_k_experts_for_two_routings():
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=L,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=512, use_cache=False)
    # Per token: attention's projections, the router (hidden x experts) and top_k experts of
    # three hidden x ffn matrices per layer, the head; 6 per weight, plus attention's 12 L H Q T.
    seq, experts, top_k, ffn = 20, 4, 2, 96
    attention = HIDDEN * HEADS * HEAD_DIM * 2 + 2 * HIDDEN * KV_HEADS * HEAD_DIM
    per_token = (6 * (L * (attention + HIDDEN * experts + top_k * 3 * HIDDEN * ffn)
                      + HIDDEN * VOCAB) + 12 * L * HEADS * HEAD_DIM * seq)
    counts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        fpb = exportflops.flops_per_batch(transformers.MixtralForCausalLM(config),
                                          (torch.randint(0, VOCAB, (2, 16)),))
        counts.append(fpb.step(torch.randint(0, VOCAB, (3, seq))).matmul_flops)
    assert counts == [3 * seq * per_token] * 2


def test_routed_sizes_on_meta_need_routed_per_token():
    with torch.device("meta"):
        model = LoopedExperts()
    example = torch.randn(2, 8, 16, device="meta")
    shapes = ({0: Dim("batch"), 1: Dim("seq")},)
    with pytest.raises(InputError, match="routed_per_token"):
        exportflops.flops_per_batch(model, (example,), dynamic_shapes=shapes)
    fpb = exportflops.flops_per_batch(model, (example,), dynamic_shapes=shapes,
                                      routed_per_token=2)
    d, h, e, k = 16, 32, 4, 2
    per_token = 2 * (2 * d * e) + k * (2 * (2 * d * h) + 3 * (2 * h * d))
    assert fpb.step(torch.empty(4, 6, 16, device="meta")).matmul_flops == 24 * per_token


class Checkpointed(nn.Module):
    """a and its relu under activation checkpointing, then b."""

    def __init__(self, reentrant: bool, width=8):
        super().__init__()
        self.reentrant = reentrant
        self.a, self.b = nn.Linear(width, width), Relu()
        self.c = nn.Linear(width, width)

    def forward(self, x):
        region = nn.Sequential(self.a, self.b)
        return self.c(checkpoint(region, x, use_reentrant=self.reentrant))


class Relu(nn.Module):
    def forward(self, x):
        return x.relu()


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_recompute_is_hardware_flops_not_model_flops(reentrant):
    """torch.export records reentrant checkpointing; a non-reentrant one leaves no mark in the
    graph and is found by the saved-tensor hook it holds while its region runs."""
    x = torch.randn(4, 8, requires_grad=True)
    fpb = exportflops.flops_per_batch(Checkpointed(reentrant), (x,))
    step = fpb.step(torch.randn(6, 8, requires_grad=True))
    # The checkpointed region (a: 2 x 8 x 8 per row plus its bias, then relu: 1 per element)
    # runs again in the backward: 6 rows x (128 + 8 + 8). The model FLOPs: a and c forward
    # (2 x 136 per row), relu (8), c's input and weight gradients (2 x 128) and bias (8), relu's
    # gradient (8), a's input and weight gradients (2 x 128) and bias (8).
    assert step.hardware_flops - step.model_flops == 6 * (2 * 8 * 8 + 8 + 8)
    assert step.executed_flops == step.hardware_flops
    assert step.model_flops == 6 * (2 * 136 + 8 + 2 * 128 + 8 + 8 + 2 * 128 + 8)


def test_a_size_the_analysis_fixed_is_checked_on_every_batch():
    fpb = _attention_fpb()
    with pytest.raises(InputError, match="two values|dims"):
        fpb(torch.zeros(3, 9, 2, dtype=torch.long), attention_mask=torch.ones(3, 9))
    fpb_float = exportflops.flops_per_batch(nn.Linear(8, 4), (torch.randn(3, 8),))
    with pytest.raises(InputError, match="fixed it at the example's 8"):
        fpb_float(torch.randn(3, 5))
    assert fpb_float(torch.randn(10, 8)) == exportflops.analyze(
        nn.Linear(8, 4), (torch.randn(10, 8),), mode="train").total.flops


@pytest.mark.parametrize("seqlens", [[], [0, 3], [2.5], [True]], ids=["empty", "zero", "float",
                                                                       "bool"])
def test_bad_seqlens_are_refused(seqlens):
    with pytest.raises(InputError, match="seqlens"):
        _attention_fpb()(seqlens=seqlens)


def test_equal_batch_and_sequence_sizes_are_refused_with_the_fix():
    with pytest.raises(InputError, match="distinct sizes"):
        exportflops.flops_per_batch(Attention(), (torch.zeros(4, 4, dtype=torch.long),))


def test_cross_entropys_gradient_is_counted_at_dynamic_sizes_per_target():
    """nll_loss_backward: 2 FLOPs per target (scale, divide by the total weight); at dynamic
    sizes torch's decomposition cannot run, so a formula must count it."""
    model = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 32))

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, labels):
            logits = self.model(ids)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    ids = torch.zeros(2, 5, dtype=torch.long)
    fpb = exportflops.flops_per_batch(WithLoss(), (ids, ids))
    assert fpb.complete and fpb.report.uncounted == []
    gradient = [n for n in fpb.report.nodes if n.op == "aten.nll_loss_backward.default"]
    assert [str(n.cost.flops) for n in gradient] == ["2*batch*seq"]


def test_a_batch_without_the_examples_labels_or_with_other_tensors_is_refused():
    """Labels add the loss and its gradient: a batch without them runs another forward."""
    fpb = _attention_fpb()
    ids = torch.zeros(2, 9, dtype=torch.long)
    with pytest.raises(InputError, match="missing attention_mask"):
        fpb(ids)
    with pytest.raises(InputError, match="missing ids"):
        fpb(attention_mask=torch.ones(2, 9, dtype=torch.long))
    fpb_ids = _llama_fpb()
    with pytest.raises(InputError, match="not in the example labels"):
        fpb_ids(ids, labels=ids)


class _TokensAndLabels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)

    def forward(self, ids, labels=None, scale=None):
        out = self.embed(ids)
        return out if labels is None else out.sum() + labels.float().sum()


def test_resized_cuts_every_tensor_along_its_dynamic_size_and_leaves_the_rest():
    fpb = exportflops.flops_per_batch(_TokensAndLabels(), (torch.zeros(2, 6, dtype=torch.long),),
                                      {"labels": torch.zeros(2, 6, dtype=torch.long),
                                       "scale": torch.ones(3)}, mode="forward")
    ids, labels = torch.arange(12).view(2, 6), torch.arange(12).view(2, 6) + 100
    scale = torch.ones(3)
    args, kwargs = fpb.resized((ids,), {"labels": labels, "scale": scale}, seq=4)
    # The first 4 positions of each row, of both (batch, seq) tensors; scale has no seq.
    assert args[0].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert kwargs["labels"].tolist() == [[100, 101, 102, 103], [106, 107, 108, 109]]
    assert kwargs["scale"].shape == (3,)
    for size in (0, 7):  # no positions; more than the batch has
        with pytest.raises(InputError, match=f"seq={size} is not in 1..6"):
            fpb.resized((ids,), {"labels": labels, "scale": scale}, seq=size)
