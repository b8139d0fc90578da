"""Parallelized models, one rank at a time: counts from local shards, and every collective with
nccl-tests' message size (doc/PERFORMANCE.md in github.com/NVIDIA/nccl-tests). Expected numbers
are derived below from the shapes of Megatron's tensor-parallel MLP split (Shoeybi et al. 2019,
section 3): the first linear's columns and the second's rows are split over the group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import exportflops
from exportflops import Report, fake_process_group
from exportflops.formulas.collectives import KINDS
from exportflops.errors import DistributedError
from tests.parallel_models import BATCH, FFN, HIDDEN, SEQ, Net, TwoBlocks, tensor_parallel

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element


def _rank_report(tp: int, rank: int, *, sequence: bool = False, mode: str = "train") -> Report:
    from torch.distributed.device_mesh import init_device_mesh

    with fake_process_group(tp, rank=rank):
        mesh = init_device_mesh("cpu", (tp,))
        with torch.device("meta"):
            model = tensor_parallel(Net(), mesh, sequence=sequence)
        # Sequence parallel: each rank holds its slice of the sequence between blocks.
        seq = SEQ // tp if sequence else SEQ
        x = torch.randn(BATCH, seq, HIDDEN, device="meta", requires_grad=True)
        return exportflops.analyze(model, (x,), mode=mode)


@pytest.fixture(scope="module")
def single() -> Report:
    with torch.device("meta"):
        x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
        return exportflops.analyze(Net(), (x,), mode="train")


def _collectives(report: Report) -> list[tuple]:
    return [(c.op, c.phase, c.module, c.bytes, c.group_size) for c in report.collectives]


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2", "tp4"])
def test_each_rank_does_its_shard_of_each_linear_and_one_all_reduce_per_row_parallel_linear(
        tp, single):
    report = _rank_report(tp, rank=tp - 1)
    assert (report.world_size, report.rank) == (tp, tp - 1)
    up, down = report.module("blocks.0.up"), report.module("blocks.0.down")
    # 1. up is column-parallel: all B*T rows of x times this rank's F/tp columns of W_up.
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * (FFN // tp)
    # 2. down is row-parallel: its F/tp input features, all H outputs (a partial sum).
    assert down.inclusive.macs - down.backward.macs == BATCH * SEQ * (FFN // tp) * HIDDEN
    # 3. backward of a linear: grad of the input and grad of the weight, each as many MACs as
    #    the forward (x requires grad, so up's input gradient is computed too).
    assert up.backward.macs == 2 * BATCH * SEQ * HIDDEN * (FFN // tp)
    assert down.backward.macs == 2 * BATCH * SEQ * (FFN // tp) * HIDDEN
    # 4. parameters: each linear's F*H weight split tp ways; the norm's weight and bias whole.
    assert (up.params, down.params) == (HIDDEN * FFN // tp, FFN * HIDDEN // tp)
    assert report.module("blocks.0.norm").params == 2 * HIDDEN
    # 5. the replicated norm does on every rank what it does on one device.
    norm, alone = report.module("blocks.0.norm"), single.module("blocks.0.norm")
    assert (norm.inclusive.flops, norm.backward.flops) == (alone.inclusive.flops,
                                                           alone.backward.flops)
    # 6. collectives: down's partial sums all-reduced in the forward (the B x T x H output),
    #    and in the backward the gradient of up's replicated input, of which each rank holds
    #    the part from its columns (B x T x H again).
    message = BATCH * SEQ * HIDDEN * F32
    assert _collectives(report) == [("all_reduce", "forward", "blocks.0.down", message, tp),
                                    ("all_reduce", "backward", "blocks.0.up", message, tp)]
    # 7. nccl-tests' bus bandwidth factor of a ring all-reduce: 2(n-1)/n.
    assert [c.bandwidth_factor for c in report.collectives] == [2 * (tp - 1) / tp] * 2


@pytest.mark.parametrize("names, mesh_dim", [(("tp",), "tp"), (None, "")],
                         ids=["named", "unnamed"])
def test_a_one_dimensional_mesh_names_its_collectives_by_its_dimension(names, mesh_dim):
    from torch.distributed.device_mesh import init_device_mesh

    # A mesh dimension spanning the world gets torch's default group, which its description
    # does not name ("default_pg", not "mesh_tp"); the mesh the parameters live on names it.
    with fake_process_group(2, rank=1):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=names)
        with torch.device("meta"):
            model = tensor_parallel(Net(), mesh)
        x = torch.randn(BATCH, SEQ, HIDDEN, device="meta")
        report = exportflops.analyze(model, (x,))
    assert [(c.op, c.module, c.mesh_dim) for c in report.collectives] == [
        ("all_reduce", "blocks.0.down", mesh_dim)]


def test_matmul_work_summed_over_ranks_is_the_single_device_work(single):
    ranks = [_rank_report(2, rank) for rank in range(2)]
    assert sum(r.total.macs for r in ranks) == single.total.macs
    assert sum(r.backward.macs for r in ranks) == single.backward.macs


def test_forward_mode_counts_the_forward_of_the_joint_graph_only():
    train, forward = _rank_report(2, 0), _rank_report(2, 0, mode="forward")
    assert forward.backward.flops == 0 and forward.total == train.forward
    assert [c.phase for c in forward.collectives] == ["forward"]


def test_sequence_parallel_gathers_and_reduce_scatters_instead_of_all_reducing(single):
    tp = 2
    report = _rank_report(tp, rank=0, sequence=True)
    # The full sequence's activations, B x T x H: gathered before up, reduce-scattered after
    # down; in the backward, down's output gradient gathered and up's input gradient
    # reduce-scattered. nccl-tests sizes an all-gather by its output, a reduce-scatter by its
    # input: both are the full B x T x H tensor.
    message = BATCH * SEQ * HIDDEN * F32
    assert _collectives(report) == [
        ("all_gather", "forward", "blocks.0.up", message, tp),
        ("reduce_scatter", "forward", "blocks.0.down", message, tp),
        ("all_gather", "backward", "blocks.0.down", message, tp),
        ("reduce_scatter", "backward", "blocks.0.up", message, tp)]
    assert [c.bandwidth_factor for c in report.collectives] == [(tp - 1) / tp] * 4
    # The norm runs on this rank's T/tp tokens; the linears on the gathered sequence.
    norm, alone = report.module("blocks.0.norm"), single.module("blocks.0.norm")
    assert norm.inclusive.flops * tp == alone.inclusive.flops
    up = report.module("blocks.0.up")
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * (FFN // tp)


def test_fsdp2_on_meta_parameters_is_refused_with_a_typed_error_naming_fake_tensors():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        with torch.device("meta"):
            model = Net()
        fully_shard(model.blocks[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        x = torch.randn(BATCH, SEQ, HIDDEN, device="meta")
        with pytest.raises(DistributedError, match="FakeTensorMode"):
            exportflops.analyze(model, (x,), mode="train")


def test_fsdp2_gathers_each_blocks_parameters_in_forward_and_reduce_scatters_gradients():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = 2
    with fake_process_group(world):
        mesh = init_device_mesh("cpu", (world,))
        with FakeTensorMode():  # FSDP2 refuses meta parameters; fake ones allocate nothing
            model = TwoBlocks()
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            x = torch.randn(BATCH, SEQ, HIDDEN)
        report = exportflops.analyze(model, (x,), mode="train")
    # A block's parameters: LayerNorm weight and bias 2H, up H x F, down F x H.
    block = 2 * HIDDEN + HIDDEN * FFN + FFN * HIDDEN
    assert block == 2080
    # 1. each rank holds 1/world of each block's parameters.
    assert report.module("blocks.0").params == block // world
    # 2. the arithmetic runs on the gathered (whole) parameters: up's forward is B*T x H x F.
    up = report.module("blocks.1.up")
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * FFN
    # 3. forward: one all-gather per block in its pre-forward hook; nccl-tests sizes it by the
    #    gathered output, the block's whole parameters: 2080 * 4 bytes (each rank receives
    #    (world - 1) / world of it).
    forward = [(c.op, c.module, c.bytes) for c in report.collectives if c.phase == "forward"]
    assert forward == [("all_gather", "blocks.0", block * F32),
                       ("all_gather", "blocks.1", block * F32)]
    # 4. backward: blocks resharded after forward (fully_shard's default) are gathered again,
    #    and each block's gradients reduce-scattered, sized by the input: the whole gradient.
    backward = sorted((c.op, c.bytes) for c in report.collectives if c.phase == "backward")
    assert backward == [("all_gather", block * F32)] * 2 + [("reduce_scatter", block * F32)] * 2
    assert {c.bandwidth_factor for c in report.collectives} == {(world - 1) / world}
    assert report.uncounted == []


def test_fake_process_group_refuses_a_second_group_and_bad_ranks():
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        with fake_process_group(2, rank=2):
            pass
    with fake_process_group(2):
        with pytest.raises(DistributedError, match="already"):
            with fake_process_group(4):
                pass
    assert not torch.distributed.is_initialized()  # destroyed on exit


def test_a_rank_report_round_trips_through_json():
    report = _rank_report(2, 1)
    assert Report.model_validate_json(report.model_dump_json()) == report


def test_hugging_face_llama_with_its_own_tp_plan_at_tp2():
    transformers = pytest.importorskip("transformers")
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.integrations.tensor_parallel import apply_tensor_parallelism

    tp, seq, hidden, ffn, vocab, heads, kv_heads, head_dim = 2, 8, 32, 64, 64, 4, 2, 8
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)
    with fake_process_group(tp):
        mesh = init_device_mesh("cpu", (tp,))
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        # The model's own plan (config.base_model_tp_plan), expanded per layer as
        # from_pretrained(tp_plan="auto") does.
        apply_tensor_parallelism(model, mesh, model._expand_parallel_plan(model.tp_plan))
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        report = exportflops.analyze(model, (ids,), {"use_cache": False}, mode="train")

    def forward_macs(path: str) -> int:
        module = report.module(f"model.layers.0.{path}" if path != "lm_head" else path)
        return module.inclusive.macs - module.backward.macs

    # Column-parallel projections: T rows times 1/tp of the output features.
    assert forward_macs("self_attn.q_proj") == seq * hidden * heads * head_dim // tp
    assert forward_macs("self_attn.k_proj") == seq * hidden * kv_heads * head_dim // tp
    assert forward_macs("mlp.gate_proj") == seq * hidden * ffn // tp
    assert forward_macs("lm_head") == seq * hidden * vocab // tp
    # Row-parallel: 1/tp of the input features.
    assert forward_macs("self_attn.o_proj") == seq * (heads * head_dim // tp) * hidden
    assert forward_macs("mlp.down_proj") == seq * (ffn // tp) * hidden
    # Attention of this rank's heads/tp heads: Q K^T and A V, T x T x head_dim each.
    projections = seq * hidden * (2 * heads + 2 * kv_heads) * head_dim // tp
    assert forward_macs("self_attn") == projections + heads // tp * 2 * seq * seq * head_dim
    # Forward: the vocabulary-parallel embedding, o_proj and down_proj all-reduce T x H; the
    # head gathers the T x V logits.
    forward = [(c.op, c.module, c.bytes) for c in report.collectives if c.phase == "forward"]
    assert forward == [("all_reduce", "model.embed_tokens", seq * hidden * F32),
                       ("all_reduce", "model.layers.0.self_attn.o_proj", seq * hidden * F32),
                       ("all_reduce", "model.layers.0.mlp.down_proj", seq * hidden * F32),
                       ("all_gather", "lm_head", seq * vocab * F32)]
    # Backward: each column-parallel layer all-reduces its replicated input's gradient.
    backward = {(c.op, c.module, c.bytes) for c in report.collectives if c.phase == "backward"}
    layer = "model.layers.0."
    assert backward == {("all_reduce", module, seq * hidden * F32) for module in (
        "lm_head", *(layer + p for p in ("self_attn.q_proj", "self_attn.k_proj",
                                         "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_real_gloo_processes_agree_with_the_fake_process_group(tmp_path):
    root = Path(__file__).parents[2]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               str(root / "tests" / "distributed_worker.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        written = json.loads((tmp_path / f"rank{rank}.json").read_text())
        real = Report.model_validate_json(written["report"])
        assert real == _rank_report(2, rank)
        # The collectives that ran in a real step (torch's CommDebugMode) are those listed.
        ran = {KINDS[op.rpartition(".")[2]].name: calls for op, calls in written["ran"].items()}
        listed: dict[str, int] = {}
        for collective in real.collectives:
            listed[collective.op] = listed.get(collective.op, 0) + 1
        assert ran == listed


@pytest.mark.parametrize("source, path", [
    ("L['self'].layers[0].mlp", "layers.0.mlp"),
    ("L['self']._modules['mlp']", "mlp"),
    ("L['self'][0]", "0"),  # the first child of a Sequential
    # A decorator's wrapper (transformers' deprecate_kwarg) takes self in its *args.
    ("L['args'][0].model.layers[0]", "model.layers.0"),
])
def test_dynamos_module_sources_become_the_models_own_paths(source, path):
    from exportflops.capture.dtensor import user_path

    assert user_path(source) == path


class HookedScale(torch.nn.Module):
    """A column-parallel linear whose forward hook calls a sibling module, ``scale``: dynamo
    names that module through the hook (``L['self'].up._forward_hooks[...].args[0]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16, bias=False)
        self.scale = torch.nn.Linear(8, 8, bias=False)  # on each rank's 16 / 2 outputs

    def forward(self, x):
        return self.up(x)


def test_a_module_a_hook_calls_is_charged_to_its_own_path():
    from functools import partial

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    with fake_process_group(2):
        model = HookedScale()
        parallelize_module(model, init_device_mesh("cpu", (2,)), {"up": ColwiseParallel()})
        model.up.register_forward_hook(partial(lambda scale, module, args, out: scale(out),
                                               model.scale))
        report = exportflops.analyze(model, (torch.randn(4, 8),))
    assert report.module("scale").inclusive.macs == 4 * 8 * 8  # 4 rows of this rank's 8
    assert report.module("up").exclusive.macs == 4 * 8 * 8  # (4, 8) @ (8, 16 / 2)
    assert not any("hooks" in module.path for module in report.modules)


class ShardedThenDecomposed(torch.nn.Module):
    """A column-parallel linear whose local output feeds two ops with no formula of their own,
    counted through torch's decomposition (tests/count/test_decompose.py derives both)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16, bias=False)

    def forward(self, x):
        h = self.up(x)  # (4, 16 / tp) on each rank
        return torch.nn.functional.mse_loss(h, h * 2), torch.addr(h[:, :3], h[:, 0], h[0, :3])


def test_an_op_counted_through_its_decomposition_on_one_device_is_counted_per_rank_too():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    x = torch.randn(4, 8)
    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        model = parallelize_module(ShardedThenDecomposed(), mesh,
                                   {"up": ColwiseParallel(use_local_output=True)})
        report = exportflops.analyze(model, (x,))
    flops = {n.op: n.cost.flops for n in report.nodes}
    assert report.uncounted == []
    # h is (4, 8) on each rank. mse_loss(h, 2h), mean over 32 elements: 32 subtracts, 32
    # squares, 32 adds and 1 divide = 97. addr(h[:, :3], h[:, 0], h[0, :3]): 4*3 = 12 products,
    # scaled by alpha and beta (12 + 12 multiplies) before 12 adds = 48.
    assert flops["aten.mse_loss.default"] == 32 * 3 + 1
    assert flops["aten.addr.default"] == 12 * 4


@pytest.mark.parametrize("width, tp", [(30, 4), (2, 4), (32, 3)], ids=["30-over-4", "2-over-4",
                                                                       "32-over-3"])
def test_a_split_the_ranks_do_not_divide_is_named_with_its_module_dimension_and_size(width, tp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    with fake_process_group(tp):
        mesh = init_device_mesh("cpu", (tp,))
        with torch.device("meta"):
            mlp = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                      torch.nn.Linear(width, 8))
            model = parallelize_module(mlp, mesh, {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel()})
            x = torch.randn(2, 8, device="meta")
        with pytest.raises(DistributedError) as caught:
            exportflops.analyze(model, (x,), mode="train")
    message = str(caught.value)
    assert f"dimension 0 of weight of module '0' ({width}) over {tp} ranks" in message
    assert f"dimension 1 of weight of module '2' ({width}) over {tp} ranks" in message
    assert "torch.compile" not in message.split("torch said:")[0]
