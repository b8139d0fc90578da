"""FSDP2 (``fully_shard``), one rank at a time: each collective attributed to the unit whose
parameters it carries, and the command's ``--fsdp N`` (alone and with ``--tp``). Message sizes
are nccl-tests' (doc/PERFORMANCE.md in github.com/NVIDIA/nccl-tests): an all-gather is sized by
its gathered output, a reduce-scatter by its input; a rank receives (n-1)/n of an all-gather's
message. Parameter counts are derived from `tests.parallel_models.NormMLP`'s shapes."""

from __future__ import annotations

import pytest
import torch

import exportflops
from exportflops import fake_process_group
from tests.cli_support import ROOT, one_paragraph, report_of, run
from tests.parallel_models import BATCH, FFN, HIDDEN, SEQ, TwoBlocks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element
#: One NormMLP block's parameters: LayerNorm weight and bias 2H, up H x F, down F x H.
BLOCK = 2 * HIDDEN + HIDDEN * FFN + FFN * HIDDEN


@pytest.mark.parametrize("input_grad", [False, True], ids=["input_no_grad", "input_grad"])
def test_fsdp2_backward_collectives_belong_to_the_unit_whose_parameters_they_carry(input_grad):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        with FakeTensorMode():
            model = TwoBlocks()
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=input_grad)
        report = exportflops.analyze(model, (x,), mode="train")
    backward = [(c.op, c.module, c.bytes) for c in report.collectives if c.phase == "backward"]
    # The backward runs blocks.1 then blocks.0. 1. blocks.1, resharded after forward, is
    # gathered again in its pre-backward; 2. FSDP2 prefetches blocks.0's all-gather inside
    # blocks.1's backward (it ran under blocks.1's stack before); 3. each block's gradients
    # are reduce-scattered; blocks.0's, when x needs no gradient, by the root's final callback
    # (it had no module before). Every message is the block's whole parameters, float32.
    assert backward == [("all_gather", "blocks.1", BLOCK * F32),
                        ("all_gather", "blocks.0", BLOCK * F32),
                        ("reduce_scatter", "blocks.1", BLOCK * F32),
                        ("reduce_scatter", "blocks.0", BLOCK * F32)]


def test_the_command_shards_each_block_then_the_root_and_reports_the_rank_asked():
    world = 2
    report = report_of(run("tests.parallel_models:two_blocks", "--fsdp", str(world), "--rank",
                           "1", "--mode", "train", "--format", "json", cwd=ROOT))
    assert (report.world_size, report.rank) == (world, 1)
    # 1. each rank holds 1/world of each block: (32 + 1024 + 1024) / 2 = 1040 parameters.
    assert BLOCK == 2080
    assert [report.module(f"blocks.{i}").params for i in (0, 1)] == [BLOCK // world] * 2
    # 2. the arithmetic runs on the gathered parameters: up's forward is B*T x H x F.
    up = report.module("blocks.0.up")
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * FFN
    # 3. one all-gather per block per forward, of its 2080 * 4 = 8320 parameter bytes; the
    #    root holds no parameters of its own, so it gathers nothing. Backward: blocks.1
    #    gathered again, blocks.0 too (both resharded after forward), then each block's
    #    gradient (the same 8320 bytes) reduce-scattered.
    message = BLOCK * F32
    assert message == 8320
    assert [(c.op, c.phase, c.module, c.bytes, c.group_size) for c in report.collectives] == [
        ("all_gather", "forward", "blocks.0", message, world),
        ("all_gather", "forward", "blocks.1", message, world),
        ("all_gather", "backward", "blocks.1", message, world),
        ("all_gather", "backward", "blocks.0", message, world),
        ("reduce_scatter", "backward", "blocks.1", message, world),
        ("reduce_scatter", "backward", "blocks.0", message, world)]
    # 4. what a rank receives of a block's all-gather: (n-1)/n of 8320 bytes, the other ranks'
    #    shards, 4160 bytes at n = 2.
    assert [c.bytes * c.bandwidth_factor for c in report.collectives[:2]] == [4160.0] * 2


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_the_roots_own_parameters_are_counted_at_their_shard(mode):
    """FSDP2 leaves the root's parameters unsharded after a forward (the root does not
    reshard): a rank holds 1/world of the head all the same."""
    world = 2
    report = report_of(run("tests.parallel_models:blocks_and_head", "--fsdp", str(world),
                           "--mode", mode, "--format", "json", cwd=ROOT))
    head = HIDDEN * FFN  # 16 x 64, no bias
    assert report.module("head").params == head // world
    assert report.params == (BLOCK * 2 + head) // world


def test_the_command_shards_the_tensor_parallel_shards_on_a_two_dimensional_mesh():
    fsdp, tp = 2, 2
    report = report_of(run("tests.parallel_models:planned", "--fsdp", str(fsdp), "--tp",
                           str(tp), "--rank", "3", "--mode", "train", "--format", "json",
                           cwd=ROOT))
    assert (report.world_size, report.rank) == (fsdp * tp, 3)
    # 1. the block's tensor-parallel shard: the norm whole (2H), up's F/tp columns and down's
    #    F/tp rows: 32 + 512 + 512 = 1056 parameters, of which FSDP2 keeps 1/fsdp per rank.
    local = 2 * HIDDEN + HIDDEN * FFN // tp + FFN // tp * HIDDEN
    assert local == 1056
    assert report.module("blocks.0").params == local // fsdp
    # 2. FSDP2 gathers the 1056 * 4 bytes over its 2 ranks; tensor parallel all-reduces down's
    #    B x T x H output in forward and up's input gradient in backward (2 * 8 * 16 * 4).
    activation = BATCH * SEQ * HIDDEN * F32
    # Each on its own mesh dimension, named as the command names the mesh's: (fsdp, tp).
    assert [(c.op, c.phase, c.module, c.bytes, c.group_size, c.mesh_dim)
            for c in report.collectives] == [
        ("all_gather", "forward", "blocks.0", local * F32, fsdp, "fsdp"),
        ("all_reduce", "forward", "blocks.0.down", activation, tp, "tp"),
        ("all_gather", "backward", "blocks.0", local * F32, fsdp, "fsdp"),
        ("all_reduce", "backward", "blocks.0.up", activation, tp, "tp"),
        ("reduce_scatter", "backward", "blocks.0", local * F32, fsdp, "fsdp")]


@pytest.mark.parametrize("args, message", [
    (("--fsdp", "0"), "--fsdp 0: Layout: fsdp is a degree, an int >= 1"),
    (("--fsdp", "2", "--tp", "2", "--rank", "4"), "--rank one of 0..3"),
    (("--rank", "1"), "pass one of them too"),
], ids=["degree", "rank_out_of_range", "rank_alone"])
def test_the_command_refuses_fsdp_options_that_cannot_apply(args, message):
    result = run("tests.parallel_models:two_blocks", *args, cwd=ROOT)
    assert result.returncode == 2 and message in result.stderr and one_paragraph(result.stderr)


def test_the_blocks_fsdp_shards_are_decoder_layers_or_module_list_entries():
    from exportflops.parallel.fsdp_blocks import blocks_of
    from exportflops.examples.gpt2 import gpt2
    from exportflops.examples.llama import LlamaConfig, llama

    config = LlamaConfig(vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                         head_dim=8, ffn_dim=64, max_seq_len=8)
    model, _ = llama("meta", config, seq_len=8)
    assert blocks_of(model) == list(model.layers)
    model, _ = gpt2("meta", seq_len=8)
    assert blocks_of(model) == list(model.transformer.h)
    # A Hugging Face model names its decoder layer class in _no_split_modules.
    named = TwoBlocks()
    named._no_split_modules = ["LayerNorm"]
    assert blocks_of(named) == [block.norm for block in named.blocks]
