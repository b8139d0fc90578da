"""One rank of a parallelized model with its backward in the two passes torch's zero-bubble
schedules run (``analyze(split_backward=True)``, `exportflops.graph.passes`):
``stage_backward_input`` computes the inputs' gradients, ``stage_backward_weight`` the
parameters' (torch/distributed/pipelining/_backward.py).

Expected numbers are derived from `tests.parallel_models.NormMLP`'s shapes under Megatron's
split (Shoeybi et al. 2019, section 3): a linear's backward is two matmuls, the input's
gradient (dY W, in the input pass) and the weight's (dY^T X, in the weight pass), each as many
MACs as its forward, and on a rank 1/tp of the single device's. Message sizes are nccl-tests'
(doc/PERFORMANCE.md in github.com/NVIDIA/nccl-tests)."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops import Report, fake_process_group
from exportflops.errors import DistributedError
from exportflops.torch_internals import FakeTensorMode
from tests.parallel_models import (BATCH, FFN, HIDDEN, SEQ, Net, NormMLP, TwoBlocks,
                                   tensor_parallel)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element


def _tensor_parallel_rank(tp: int, *, sequence: bool = False, input_grad: bool = True) -> Report:
    from torch.distributed.device_mesh import init_device_mesh

    with fake_process_group(tp, rank=tp - 1):
        mesh = init_device_mesh("cpu", (tp,))
        with torch.device("meta"):
            model = tensor_parallel(Net(), mesh, sequence=sequence)
        seq = SEQ // tp if sequence else SEQ
        x = torch.randn(BATCH, seq, HIDDEN, device="meta", requires_grad=input_grad)
        return exportflops.analyze(model, (x,), mode="train", split_backward=True)


def _pass_macs(report: Report, module: str) -> dict[str, int]:
    macs = {"input": 0, "weight": 0}
    for node in report.nodes:
        if node.phase == "backward" and node.module == module:
            macs[node.gradient] += node.cost.macs
    return macs


def _rank(build: type[torch.nn.Module], split: str, given: str = "leaf", **options) -> Report:
    """The rank 0 of 2 of ``build()``: Megatron's split of its block (``tp``), or FSDP2 on
    each block, then the root, on fake tensors (``fsdp``: it refuses meta parameters). Its
    input needs a gradient: a leaf (``given="leaf"``), one holding a gradient already
    (``"leaf-with-grad"``), or computed from one (``"non-leaf"``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        with FakeTensorMode() if split == "fsdp" else torch.device("meta"):
            model = build()
            if split == "tp":
                tensor_parallel(model, mesh)
            else:
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
            x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
            held = x.grad = torch.zeros_like(x) if given == "leaf-with-grad" else None
            fed = x * 1 if given == "non-leaf" else x
        report = exportflops.analyze(model, (fed,), mode="train", **options)
    assert x.grad is held  # the trace leaves the caller's input as it was
    return report


class Twice(torch.nn.Module):
    """One block applied twice: its parameters meet the input's way at two places."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([NormMLP()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](self.blocks[0](x))


class Checkpointed(torch.nn.Module):
    """`Net`'s block under activation checkpointing with ``options`` (None: not checkpointed),
    with ``norm_after`` a LayerNorm after it, outside the checkpoint, which saves the block's
    output for its own backward."""

    options: dict | None = {"use_reentrant": False}
    norm_after = False

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([NormMLP()])
        self.after = torch.nn.LayerNorm(HIDDEN) if self.norm_after else torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self.options is None:
            return self.after(self.blocks[0](x))
        return self.after(checkpoint(self.blocks[0], x, **self.options))


class Reentrant(Checkpointed):
    options = {"use_reentrant": True}


class Unset(Checkpointed):
    options: dict = {}  # torch 2.13 takes it as reentrant, and warns


class NoEarlyStop(Checkpointed):
    options = {"use_reentrant": False, "early_stop": False}


class NormAfter(Checkpointed):
    norm_after = True


class Plain(Checkpointed):
    options = None


class NormAfterPlain(NormAfter):
    options = None


class Selective(Checkpointed):
    """Checkpointed with a selective policy saving the matmuls."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from functools import partial

        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        policy = partial(create_selective_checkpoint_contexts, [torch.ops.aten.mm.default])
        return checkpoint(self.blocks[0], x, use_reentrant=False, context_fn=policy)


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2", "tp4"])
def test_each_linears_two_gradients_fall_in_their_passes_on_a_rank(tp):
    report = _tensor_parallel_rank(tp)
    # up (column-parallel) holds F/tp output columns, down (row-parallel) F/tp input rows:
    # each of their two gradient matmuls is B*T*H*F/tp MACs on the rank.
    shard = BATCH * SEQ * HIDDEN * (FFN // tp)
    for module in ("blocks.0.up", "blocks.0.down"):
        assert _pass_macs(report, module) == {"input": shard, "weight": shard}
    assert report.backward_weight.macs == 2 * shard


def test_a_replicated_norm_splits_as_on_one_device():
    # Two independent ways to the two passes: the single device's backward replayed through
    # autograd op by op, and the rank's traced backward split by what the input's gradient
    # needs. The norm is replicated, so its kernel and its halves are the same on both.
    with torch.device("meta"):
        x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
        single = exportflops.analyze(Net(), (x,), mode="train", split_backward=True)
    rank = _tensor_parallel_rank(2)

    def halves(report):
        return sorted((n.gradient, n.op, n.cost.flops) for n in report.nodes
                      if n.phase == "backward" and n.module == "blocks.0.norm"
                      and n.op != "getitem")  # the rank's graph unpacks the kernel's outputs

    assert halves(rank) == halves(single)
    assert {gradient for gradient, _, _ in halves(rank)} == {"input", "weight"}


@pytest.mark.parametrize("sequence", [False, True], ids=["tp", "sequence-parallel"])
def test_the_gradients_collectives_run_in_the_input_pass(sequence):
    tp = 2
    report = _tensor_parallel_rank(tp, sequence=sequence)
    backward = [(c.op, c.gradient, c.bytes) for c in report.collectives if c.phase == "backward"]
    # Each collective of the backward moves an activation's gradient on its way to x's:
    # without sequence parallelism up's replicated input gets partial sums from the F/tp
    # columns, all-reduced; with it down's output gradient is gathered over the sequence and
    # up's input gradient reduce-scattered back onto it. Each message is the (B, T, H) float32
    # hidden state's gradient.
    message = BATCH * SEQ * HIDDEN * F32
    expected = ([("all_gather", "input", message), ("reduce_scatter", "input", message)]
                if sequence else [("all_reduce", "input", message)])
    assert sorted(backward) == expected


def test_without_an_input_needing_a_gradient_all_is_the_weight_pass():
    # As on one device: with no input gradient to compute there is no input pass, and the
    # whole backward is counted in the weight half (as a first stage's, which torch runs
    # whole when the weights' turn comes).
    report = _tensor_parallel_rank(2, input_grad=False)
    assert report.backward_weight == report.backward
    assert {c.gradient for c in report.collectives if c.phase == "backward"} <= {"weight"}


@pytest.mark.parametrize("given", ["leaf", "leaf-with-grad", "non-leaf"])
def test_fsdp2_reduce_scatters_the_gradients_in_the_weight_pass(given):
    report = _rank(TwoBlocks, "fsdp", given, split_backward=True)
    # FSDP2 gathers whole parameters: each linear's two gradients are the single device's.
    whole = BATCH * SEQ * HIDDEN * FFN
    for module in ("blocks.1.up", "blocks.0.down"):
        assert _pass_macs(report, module) == {"input": whole, "weight": whole}
    # A unit's reduce-scatter reads its parameters' gradients: the weight pass's. Its
    # parameters, resharded after the forward, are gathered again for the input pass, whose
    # input gradients need them.
    by_op = {}
    for c in report.collectives:
        if c.phase == "backward":
            by_op.setdefault(c.op, set()).add(c.gradient)
    assert by_op == {"all_gather": {"input"}, "reduce_scatter": {"weight"}}


@pytest.mark.parametrize("split", ["tp", "fsdp"])
def test_a_parameter_used_twice_is_refused_as_on_one_device(split):
    with torch.device("meta"):  # the single device's refusal, for the same reason
        x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
        with pytest.raises(exportflops.InputError, match="used at 2 ops"):
            exportflops.analyze(Twice(), (x,), mode="train", split_backward=True)
    with pytest.raises(exportflops.InputError, match="used more than once"):
        _rank(Twice, split, split_backward=True)


def test_zero_bubble_stages_on_tensor_parallel_ranks_split_their_backward_and_reductions():
    from exportflops.parallel.pipeline.ranks import stage_rank_counter
    from exportflops.examples.llama import LlamaConfig, llama
    from exportflops.parallel.pipeline.analysis import count_pipeline

    config = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                         head_dim=16, ffn_dim=128, max_seq_len=64)
    batch, seq, tp, link = 2, 16, 2, 1e9

    def build(device):
        return llama(device, config, seq_len=seq, batch=batch)

    model, args = build("meta")
    count = stage_rank_counter(build, 4, 4, tp=tp, fsdp=None, mode="train",
                               strict=True, split_backward=True)
    analysis = count_pipeline(model, args, stages=4, schedule="zbvzerobubble", mode="train",
                              microbatches=4, count_stage=count, link_bytes_per_s=link,
                              share_alike=True)
    record = analysis.record
    first, second = record.stages[:2]
    # torch runs stage 0's backward whole, in its weight pass (stage.py, is_first).
    assert first.backward_weight == first.backward and first.backward_input_s == 0
    # Stage 1 holds layer 1: its wq (64 -> 4 heads x 16, column-parallel) is 1/tp of
    # B*T*64*64 MACs per gradient, one in each pass.
    wq = batch * seq * 64 * 64 // tp
    assert _pass_macs(analysis.stage_reports[1], "layers.1.attention.wq") == \
        {"input": wq, "weight": wq}
    # The input pass all-reduces the hidden state's gradient at the replicated input of each
    # column-parallel linear of the layer (wq, wk, wv, w1, w3): 5 x (2, 16, 64) float32, a
    # bus-bandwidth factor 2 (n - 1) / n = 1 at n = 2; the weight pass reduces nothing.
    assert second.backward_input_collectives_s == pytest.approx(5 * batch * seq * 64 * F32 / link)
    assert second.backward_weight_collectives_s == 0
    passes = [a for a in record.timeline if a.stage == 1 and a.kind == "backward_input"]
    assert len(passes) == 4  # one per microbatch
    for action in passes:
        assert action.end_s - action.start_s == pytest.approx(
            second.backward_input_s + second.backward_input_collectives_s)


def test_dualpipev_on_pp_by_tp_stages_counts_whole_backwards_whole():
    from exportflops.examples.llama import llama
    from exportflops.parallel import Layout, analyze_ranks

    # The built-in llama's example, as `exportflops llama --pp 2 --tp 2` builds it.
    model, args = llama("meta")
    record = analyze_ranks(model, args, layout=Layout(pp=2, tp=2), schedule="dualpipev",
                           microbatches=4, mode="train")
    first, *later = record.stages
    assert first.backward_weight == first.backward
    for stage in later:
        # Each RMSNorm's backward kernel serves both passes: it runs in each, and once in a
        # whole backward, which is then shorter than the two passes.
        assert 0 < stage.backward_weight.flops < stage.backward.flops
        assert stage.backward_s < stage.backward_input_s + stage.backward_weight_s


@pytest.mark.filterwarnings("ignore:torch.utils.checkpoint")
@pytest.mark.parametrize("build, plain, whole", [
    (Checkpointed, Plain, False), (NormAfter, NormAfterPlain, False),
    (Reentrant, Plain, True), (Unset, Plain, True), (NoEarlyStop, Plain, True),
], ids=["non-reentrant", "non-reentrant-then-a-norm", "reentrant", "unset", "no-early-stop"])
def test_a_tensor_parallel_rank_reruns_its_checkpointed_forward_in_the_backward(
        build, plain, whole):
    plain, checkpointed = _rank(plain, "tp"), _rank(build, "tp")
    forward = (plain.total - plain.backward).flops
    # the checkpointed block's forward: all but the norm after it
    block = forward - sum(n.cost.flops for n in plain.nodes
                          if n.phase == "forward" and n.module.startswith("after"))
    reruns = [n for n in checkpointed.nodes if n.name.endswith(".recompute")]
    assert reruns and all(n.phase == "backward" for n in reruns)
    rerun_collectives = [(c.op, c.module, c.bytes) for c in checkpointed.collectives
                         if c.node.endswith(".recompute")]
    if whole:
        # A reentrant checkpoint (torch 2.13's default when use_reentrant is not given), or
        # one without early stop, reruns its whole function before differentiating it: the
        # backward grows by the block's forward, the row-parallel all-reduce included.
        assert checkpointed.backward.flops == plain.backward.flops + block
        assert rerun_collectives == [("all_reduce", "blocks.0.down", BATCH * SEQ * HIDDEN * F32)]
        return
    # A non-reentrant one stops once every tensor the block's ops saved is back
    # (torch.utils.checkpoint's early stop), whatever reads its output afterwards: the last
    # saved are down's matmul inputs, packed before it computes, so down's matmul
    # (B*T x F/tp x H MACs) and its all-reduce do not run.
    down = 2 * BATCH * SEQ * (FFN // 2) * HIDDEN
    assert checkpointed.backward.flops == plain.backward.flops + block - down
    assert rerun_collectives == []


@pytest.mark.parametrize("split", ["tp", "fsdp"])
def test_a_checkpointed_rank_refuses_the_two_passes_as_on_one_device(split):
    with pytest.raises(exportflops.InputError, match="activation checkpoint"):
        _rank(Checkpointed, split, split_backward=True)


def test_selective_checkpointing_under_fsdp2_is_refused():
    # Under make_fx it caches every output instead of rerunning what its policy does not
    # save: its rerun is not eager's.
    with pytest.raises(DistributedError, match="selective policy"):
        _rank(Selective, "fsdp")


def test_an_fsdp2_rank_reruns_as_eager_does_and_charges_the_backward_to_its_modules():
    plain, checkpointed = _rank(Plain, "fsdp"), _rank(Checkpointed, "fsdp")
    # FSDP2's trace runs eager checkpointing itself: its rerun stops where the tensor-parallel
    # rank's count stops it (above), before down's matmul, here whole (FSDP2 gathers whole
    # parameters): B*T x F x H MACs.
    forward = (plain.total - plain.backward).flops
    down = 2 * BATCH * SEQ * FFN * HIDDEN
    assert checkpointed.backward.flops == plain.backward.flops + forward - down
    assert any(n.note.startswith("recomputed") for n in checkpointed.nodes)

    def gradients(report: Report, module: str) -> int:
        return sum(n.cost.macs for n in report.nodes if n.phase == "backward"
                   and n.module == module and not n.note.startswith("recomputed"))

    # After the rerun the backward goes on in the modules it differentiates.
    for module in ("blocks.0.up", "blocks.0.down"):
        assert gradients(checkpointed, module) == gradients(plain, module) > 0
