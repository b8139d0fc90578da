"""`exportflops.parallel.analyze_ranks`: a rank of tensor parallelism and FSDP2 from Python, the
numbers the command prints. Expected values derived from `tests.parallel_models.Net`'s shapes
(Megatron's split, Shoeybi et al. 2019, section 3: up column-parallel, down row-parallel, one
all-reduce each way)."""

from __future__ import annotations

import json

import pytest
import torch

from exportflops.cli import main
from exportflops.errors import InputError, LayoutError
from exportflops.parallel import Layout, analyze_ranks
from tests.parallel_models import BATCH, FFN, HIDDEN, SEQ, Net, planned

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element


def _planned_on(device: torch.device):
    with device:
        model, args = planned()
    return model, args, None


def test_a_tensor_parallel_rank_from_python_counts_its_shard_and_its_all_reduces():
    report = analyze_ranks(_planned_on, layout=Layout(tp=2), rank=1, mode="train")
    assert (report.world_size, report.rank) == (2, 1)
    # up is column-parallel: B*T rows x H x F/2 MACs on each rank.
    up = report.module("blocks.0.up")
    assert up.inclusive.macs - up.backward.macs == BATCH * SEQ * HIDDEN * (FFN // 2)
    # down's output and up's input gradient, B x T x H float32: 2 * 8 * 16 * 4 = 1024 bytes.
    assert BATCH * SEQ * HIDDEN * F32 == 1024
    # The layout's mesh is one dimension, tp, over the whole world: its group is named tp.
    assert [(c.op, c.phase, c.module, c.bytes, c.mesh_dim) for c in report.collectives] == [
        ("all_reduce", "forward", "blocks.0.down", 1024, "tp"),
        ("all_reduce", "backward", "blocks.0.up", 1024, "tp")]


@pytest.mark.parametrize("degrees, flags", [
    ({"tp": 2}, ["--tp", "2", "--rank", "1"]),
    ({"fsdp": 2}, ["--fsdp", "2", "--rank", "1"]),
    ({"fsdp": 2, "tp": 2}, ["--fsdp", "2", "--tp", "2", "--rank", "3"]),
], ids=["tp", "fsdp", "fsdp-x-tp"])
def test_the_rank_from_python_is_the_report_the_command_prints(degrees, flags, capsys):
    assert main(["tests.parallel_models:planned", *flags, "--mode", "train",
                 "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    report = analyze_ranks(_planned_on, layout=Layout(**degrees), rank=int(flags[-1]),
                           mode="train")
    assert json.loads(report.model_dump_json()) == printed


def test_a_module_given_is_left_as_it_was_and_every_rank_is_listed_without_rank():
    with torch.device("meta"):
        model, (x,) = planned()
    ranks = analyze_ranks(model, (x,), layout=Layout(tp=2))
    assert [(r.rank, r.world_size) for r in ranks] == [(0, 2), (1, 2)]
    # each rank holds half of up's columns and down's rows: H x F / 2 each.
    assert {r.module("blocks.0.up").params for r in ranks} == {HIDDEN * FFN // 2}
    assert model.blocks[0].up.weight.shape == (FFN, HIDDEN)  # the caller's model, unsplit
    assert type(model.blocks[0].up.weight) is torch.nn.Parameter


@pytest.mark.parametrize("model, layout, options, words", [
    (_planned_on, Layout(dp=2), {}, "replicated data-parallel ranks each count as one device"),
    (_planned_on, Layout(tp=2), {"routing": [1, 2]}, "routing gives the token copies per "
                                                     "expert of ep ranks: pass ep"),
    (_planned_on, Layout(tp=2), {"schedule": "1f1b"}, "schedule lay out a pipeline"),
    (lambda device: (Net().to(device), (torch.randn(BATCH, SEQ, HIDDEN),), None), Layout(tp=2),
     {}, "Net has no tensor-parallel plan to split it 2 ways"),
], ids=["replicas", "routing-without-ep", "schedule-without-pp", "no-plan"])
def test_a_layout_analyze_ranks_cannot_count_is_refused_saying_what_to_call(model, layout,
                                                                            options, words):
    with pytest.raises(LayoutError) as error:
        analyze_ranks(model, layout=layout, rank=0, **options)
    assert words in str(error.value)
    assert not torch.distributed.is_initialized()


def test_a_layout_of_one_rank_is_the_single_device_count():
    # tp 1 holds every column: up is B*T rows x H x F MACs, and no rank talks to another.
    report = analyze_ranks(_planned_on, layout=Layout(tp=1), rank=0)
    assert report.module("blocks.0.up").inclusive.macs == BATCH * SEQ * HIDDEN * FFN
    assert report.collectives == [] and (report.world_size, report.rank) == (1, 0)
    assert len(analyze_ranks(_planned_on, layout=Layout())) == 1


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    from tests.parallel.test_expert_parallel import written_models

    return written_models(tmp_path_factory.mktemp("moe_layout"))


@pytest.mark.parametrize("degrees, flags", [
    ({"dp": 2, "ep": 2}, ["--ep", "2"]),
    ({"fsdp": 4, "ep": 2}, ["--ep", "2", "--fsdp", "4"]),
], ids=["ep", "ep-inside-fsdp"])
def test_the_expert_layout_from_python_is_the_record_the_command_prints(moe_file, degrees,
                                                                        flags, capsys):
    from tests.parallel.test_expert_parallel import loaded_models

    assert main([f"{moe_file}:build", *flags, "--mode", "train", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    model, args = loaded_models(moe_file).build(torch.device("meta"))
    record = analyze_ranks(model, args, layout=Layout(**degrees), mode="train")
    assert json.loads(record.model_dump_json()) == printed
    # rank 1's report lists what it issues: FSDP2's collectives and its own all-to-alls.
    rank = analyze_ranks(model, args, layout=Layout(**degrees), mode="train", rank=1)
    assert (rank.world_size, rank.rank, rank.collectives) == (
        record.world_size(), 1, record.collectives(1))



def test_an_expert_rank_is_not_built_from_a_finished_single_device_report(moe_file):
    from exportflops import analyze
    from tests.parallel.test_expert_parallel import loaded_models

    model, args = loaded_models(moe_file).build(torch.device("meta"))
    single = analyze(model, args)
    # The rank's report is built from the count with its world and collectives; a finished
    # report holds no count to build it from.
    with pytest.raises(InputError, match="leave single_device out to have the rank's report"):
        analyze_ranks(model, args, layout=Layout(dp=2, ep=2), rank=1, single_device=single)

CONTEXT_MODELS = """
import torch
from tests.parallel.test_context_parallel import CausalAttention, ids
from tests.parallel.test_context_parallel_tp import SplitAttention


def causal(device):
    return CausalAttention().to(device), (ids().to(device),)


def split(device):
    return SplitAttention().to(device), (torch.zeros(1, 16, dtype=torch.long, device=device),)
"""


@pytest.fixture(scope="module")
def context_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cp_layout") / "cp_layout_models.py"
    path.write_text(CONTEXT_MODELS)
    return path


@pytest.mark.parametrize("build, degrees, flags", [
    ("causal", {"cp": 2}, ["--cp", "2"]),
    ("causal", {"fsdp": 2, "cp": 2}, ["--cp", "2", "--fsdp", "2"]),
    ("split", {"cp": 2, "tp": 2}, ["--cp", "2", "--tp", "2"]),
], ids=["cp", "fsdp-x-cp", "cp-x-tp"])
def test_the_context_layout_from_python_is_the_record_the_command_prints(context_file, build,
                                                                         degrees, flags, capsys):
    import importlib.util

    assert main([f"{context_file}:{build}", *flags, "--rank", "1", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    spec = importlib.util.spec_from_file_location("cp_layout_models", context_file)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    model, args = getattr(models, build)(torch.device("meta"))
    layout = Layout(**degrees)
    record = analyze_ranks(model, args, layout=layout)
    assert json.loads(record.model_dump_json()) == printed
    # rank 1 sits at its cp coordinate of its ring and sends to the ring's next rank.
    place, ring = layout.coordinates(1)["cp"], layout.group(1, "cp")
    assert record.ranks[1].cp_rank == place
    assert record.ranks[1].sends[0].to_rank == ring[(place + 1) % layout.cp]


LLAMA_MODELS = """
from exportflops.examples.llama import LlamaConfig, llama


def small(device):  # tests/parallel/test_composition.py's small Llama
    config = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                         head_dim=16, ffn_dim=128, max_seq_len=64)
    return llama(device, config, seq_len=16, batch=2)
"""


@pytest.mark.parametrize("degrees, flags", [
    ({"pp": 2, "tp": 2}, ["--pp", "2", "--tp", "2"]),
    ({"pp": 2, "fsdp": 2}, ["--pp", "2", "--fsdp", "2"]),
], ids=["pp-x-tp", "pp-x-fsdp"])
def test_the_pipeline_layout_from_python_is_the_record_the_command_prints(tmp_path, capsys,
                                                                          degrees, flags):
    path = tmp_path / "llama_layout_models.py"
    path.write_text(LLAMA_MODELS)
    assert main([f"{path}:small", *flags, "--rank", "3", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    from exportflops.examples.llama import LlamaConfig, llama

    config = LlamaConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                         head_dim=16, ffn_dim=128, max_seq_len=64)
    model, args = llama("meta", config, seq_len=16, batch=2)
    layout = Layout(**degrees)
    record = analyze_ranks(model, args, layout=layout)
    assert json.loads(record.model_dump_json()) == printed
    # rank 3 = pipeline rank 1, index 1 of its stage's group: its stage's report, sending
    # back to rank 1 (the same index of pipeline rank 0).
    assert layout.coordinates(3)["pp"] == 1
    rank = analyze_ranks(model, args, layout=layout, rank=3)
    assert (rank.world_size, rank.rank) == (4, 3)
    assert {c.peer for c in rank.collectives if c.mesh_dim == "pp"} == {1}
