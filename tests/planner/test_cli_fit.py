"""``--fit BUDGET`` through `exportflops.cli.main`, on a small embedding-and-blocks model."""

from __future__ import annotations

import json

import pytest

from exportflops.cli import main
from exportflops.parallel import Layout, memory_ranks

MODEL = '''
import torch
from torch import nn


class Blocks(nn.Module):
    """An embedding (its output needs a gradient), two MLP blocks in a ModuleList, a sum."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)) for _ in range(2))

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return x


def blocks():
    return Blocks(), (torch.randint(0, 16, (2, 4)),)
'''


def test_json_is_the_fit_plan_and_the_table_names_its_blocks(tmp_path, capsys):
    (tmp_path / "fit_models.py").write_text(MODEL)
    target = f"{tmp_path / 'fit_models.py'}:blocks"
    assert main([target, "--fit", "1GiB", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # 1 GiB holds the plain step of a 2,000-parameter model: nothing to checkpoint.
    assert (plan["budget_bytes"], plan["checkpointed"]) == (2**30, [])
    assert plan["blocks"] == ["blocks.0", "blocks.1"]
    assert main([target, "--fit", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Fit Blocks into 1GiB") and "checkpoint: nothing" in out
    assert "largest length: " in out and "(measured at 4, at 2 rows)" in out


def test_fit_refuses_another_analysis(tmp_path, capsys):
    (tmp_path / "fit_models.py").write_text(MODEL)
    code = main([f"{tmp_path / 'fit_models.py'}:blocks", "--fit", "1GiB", "--memory"])
    assert code == 2 and "--fit BUDGET plans a training step" in capsys.readouterr().err


def test_fit_plans_the_step_of_the_optimizer_given(tmp_path, capsys):
    (tmp_path / "fit_models.py").write_text(MODEL)
    target = f"{tmp_path / 'fit_models.py'}:blocks"
    # The parameters: the embedding 16 x 8, each block 8 x 32 + 32 and 32 x 8 + 8, in 9
    # tensors; AdamW keeps two fp32 moments of each and a fp32 step count per tensor
    # (torch/optim/adamw.py) at the step's peak, SGD without momentum none.
    parameters = 16 * 8 + 2 * (8 * 32 + 32 + 32 * 8 + 8)
    for optimizer, states in (("adamw", 2 * 4 * parameters + 9 * 4), ("sgd", 0)):
        assert main([target, "--fit", "1GiB", "--optimizer", optimizer, "--format",
                     "json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert (plan["optimizer"], plan["by_kind"]["optimizer"]) == (optimizer, states)


@pytest.mark.parametrize(("flag", "layout"), [
    ("--fsdp", Layout(fsdp=2)), ("--pp", Layout(pp=2))], ids=["fsdp", "pp"])
def test_fit_with_a_split_plans_per_rank_and_searches_a_ranks_batch_and_length(
        tmp_path, capsys, flag, layout):
    (tmp_path / "fit_models.py").write_text(MODEL)
    namespace: dict = {}
    exec(MODEL, namespace)
    ranks = memory_ranks(*namespace["blocks"](), layout=layout)
    target = f"{tmp_path / 'fit_models.py'}:blocks"
    # The budget: the plain step's highest rank peak, to the byte. The plan checkpoints
    # nothing and peaks there; one more row (2 -> 3) or token (4 -> 5) a rank (on a pipeline,
    # a microbatch) needs more activation bytes, so the largest batch and length are the
    # example's.
    assert main([target, "--fit", str(ranks.peak_bytes), flag, "2", "--format",
                 "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["layout"], plan["checkpointed"], plan["selective"]) == (str(layout), [], [])
    assert (plan["peak_bytes"], plan["peak_rank"]) == (ranks.peak_bytes, ranks.peak_rank)
    assert (plan["largest_batch"], plan["largest_length"]) == (2, 4)


def test_fit_refuses_a_split_a_ranks_step_does_not_model_by_its_flags(tmp_path, capsys):
    (tmp_path / "fit_models.py").write_text(MODEL)
    code = main([f"{tmp_path / 'fit_models.py'}:blocks", "--fit", "1GiB", "--pp", "2",
                 "--tp", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--fit --pp 2 --tp 2: Layout(pp=2, tp=2)" in err
    # a pipeline's stages on tp ranks are built from a Llama's own modules; not from these
    assert "Blocks (model_type None) is not modelled yet: pass Layout(pp=P) alone" in err


def test_fit_with_cp_plans_per_rank_and_searches_lengths_the_ring_splits(capsys):
    from tests.planner.rank_models import BATCH, SEQ, attention_blocks

    ranks = memory_ranks(*attention_blocks(), layout=Layout(cp=2))
    # The budget: the plain step's highest rank peak, to the byte: one more row, or the next
    # length a ring of 2 splits (SEQ + 2), needs more bytes.
    assert main(["tests/planner/rank_models.py:attention_blocks", "--fit",
                 str(ranks.peak_bytes), "--cp", "2", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["layout"], plan["peak_bytes"]) == ("Layout(cp=2)", ranks.peak_bytes)
    assert (plan["largest_batch"], plan["largest_length"]) == (BATCH, SEQ)


def test_fit_with_ep_and_routing_plans_per_rank_at_the_example_only(tmp_path, capsys):
    # The tiny Mixtral of tests/footprint/models.py on its token ids alone (a command's
    # factory gives forward's positional arguments).
    (tmp_path / "moe.py").write_text(
        "from tests.footprint.models import mixtral\n\n\n"
        "def moe():\n"
        "    model, _, kwargs = mixtral()\n"
        "    return model, (kwargs['input_ids'],)\n")
    namespace: dict = {}
    exec((tmp_path / "moe.py").read_text(), namespace)
    model, args = namespace["moe"]()
    # 2 ranks x 64 tokens x top-2 copies over 4 experts, balanced: memory_ranks' default.
    ranks = memory_ranks(model, args, {"use_cache": False}, layout=Layout(dp=2, ep=2))
    assert main([f"{tmp_path / 'moe.py'}:moe", "--fit", str(ranks.peak_bytes - 1), "--ep", "2",
                 "--routing", "64,64,64,64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Fit MixtralForCausalLM into ")
    assert "per rank of Layout(dp=2, ep=2)" in out
    assert "checkpoint: nothing" not in out and "largest batch: not searched" in out
