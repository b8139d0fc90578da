"""``exportflops MODEL --seqlens L1,L2,...``: one packed row's step, per document and in total."""

from __future__ import annotations

import json
import textwrap

import torch

import exportflops
from exportflops.records import StepFlops
from tests.cli_support import run, one_paragraph
from tests.training.test_flops_per_batch import Attention

FACTORY = textwrap.dedent("""
    import torch
    from tests.training.test_flops_per_batch import Attention

    def attention():
        torch.manual_seed(0)
        return Attention(), (torch.zeros(2, 9, dtype=torch.long),)
""")


def test_the_command_prints_each_documents_step_and_their_sum(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    result = run(f"{tmp_path / 'factory.py'}:attention", "--seqlens", "3,7,4", "--mode", "train",
                 "--format", "json")
    assert result.returncode == 0, result.stderr
    step = StepFlops.model_validate_json(result.stdout)
    # Each document as a separate step at its own length (the model has no per-row constant).
    separate = [exportflops.analyze(Attention(), (torch.zeros(1, n, dtype=torch.long),),
                                    mode="train").total.flops for n in (3, 7, 4)]
    assert [d.flops for d in step.documents] == separate
    assert step.model_flops == sum(separate) and step.tokens == 14
    table = run(f"{tmp_path / 'factory.py'}:attention", "--seqlens", "3,7,4").stdout
    assert "one packed row of 3 documents" in table and "model (MFU's numerator)" in table
    json.loads(result.stdout)


def test_bad_seqlens_and_flags_it_cannot_combine_with_are_usage_errors():
    for command in (("gpt2", "--seqlens", "4,0"), ("gpt2", "--seqlens", "a"),
                    ("gpt2", "--seqlens", "4,5", "--profile", "--device", "cpu")):
        result = run(*command)
        assert result.returncode == 2 and one_paragraph(result.stderr), result.stderr
        assert "--seqlens" in result.stderr
