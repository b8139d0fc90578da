"""The `exportflops` console script, run for real in a subprocess: each MODEL form, each format,
each error exit code with its message, and the README's main command as written.

The model of most tests is a 2-layer MLP on (3, 4): Linear(4, 8), ReLU, Linear(8, 2):
3*4*8 + 3*8*2 = 144 MACs; FLOPs 2*144 + biases 3*8 + 3*2 + ReLU 3*8 = 342.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from exportflops import Report

MLP_MACS, MLP_FLOPS = 144, 342
README = Path(__file__).resolve().parents[1] / "README.md"
FACTORY = textwrap.dedent("""
    import torch
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.randn(3, 4),)

    def bare():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def broken():
        raise RuntimeError("checkpoint shards missing")

    class Custom(nn.Module):
        def forward(self, x):
            return torch.ops.exportflops_cli.scale(x)

    @torch.library.custom_op("exportflops_cli::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    def custom():
        return Custom(), (torch.randn(2, 2),)
""")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    command = shutil.which("exportflops")
    assert command, "the exportflops console script is not installed (pip install -e .)"
    return subprocess.run([command, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / "mlp_models.py").write_text(FACTORY)
    return folder


def report_of(result: subprocess.CompletedProcess) -> Report:
    assert result.returncode == 0, result.stderr
    return Report.model_validate_json(result.stdout)


def test_readme_main_command_runs_as_written():
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    [line] = [line for line in block.splitlines() if "exportflops gpt2" in line]
    command = line.split("&&")[-1].split()
    assert command[0] == "exportflops"
    result = run(*command[1:])
    assert result.returncode == 0, result.stderr
    # Karpathy's nanoGPT table: 212,678,148,096 matmul FLOPs for GPT-2 124M at 1024 tokens.
    assert re.search(r"matmul FLOPs\s+212\.68 G", result.stdout)


def test_python_dash_m_runs_the_same_command():
    result = subprocess.run([sys.executable, "-m", "exportflops", "gpt2", "--view", "summary"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Summary of GPT" in result.stdout


def test_file_factory_returning_model_and_inputs(models):
    report = report_of(run(f"{models / 'mlp_models.py'}:mlp", "--format", "json"))
    assert (report.total.macs, report.total.flops) == (MLP_MACS, MLP_FLOPS)


def test_module_factory_with_inputs_from_the_command_line(models):
    report = report_of(run("mlp_models:bare", "--input", "3,4", "--format", "json", cwd=models))
    assert report.total.macs == MLP_MACS
    assert [s.shape for s in report.inputs] == [[3, 4]]


def test_saved_program(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(3, 4),)), path)
    assert report_of(run(str(path), "--format", "json")).total.macs == MLP_MACS


def test_hugging_face_model_from_its_default_config():
    pytest.importorskip("transformers")
    result = run("hf:gpt2", "--input", "1,16:int64", "--view", "summary")
    assert result.returncode == 0, result.stderr
    assert "Summary of GPT2LMHeadModel" in result.stdout


def test_hugging_face_vision_model_gets_an_image_input():
    """ViTConfig's defaults are ViT-B/16 at 224x224: torchvision publishes vit_b_16 at
    17.56 GFLOPS (its `_ops`, MACs; ViT_B_16_Weights.IMAGENET1K_V1)."""
    pytest.importorskip("transformers")
    result = run("hf:vit", "--view", "summary")
    assert result.returncode == 0, result.stderr
    assert re.search(r"MACs\s+17\.56 GMACs", result.stdout)


def test_csv_rows_sum_to_the_totals(models):
    target = f"{models / 'mlp_models.py'}:mlp"
    by_op = list(csv.DictReader(io.StringIO(
        run(target, "--format", "csv", "--view", "operators").stdout)))
    assert sum(int(row["flops"]) for row in by_op) == MLP_FLOPS
    by_module = list(csv.DictReader(io.StringIO(run(target, "--format", "csv").stdout)))
    # Every node is in exactly one module's exclusive count.
    assert sum(int(row["exclusive_flops"]) for row in by_module) == MLP_FLOPS
    assert int(by_module[0]["inclusive_flops"]) == MLP_FLOPS  # the root row


def test_markdown_and_output_file(models, tmp_path):
    out = tmp_path / "report.md"
    result = run(f"{models / 'mlp_models.py'}:mlp", "--format", "md", "--output", str(out))
    assert result.returncode == 0 and result.stdout == ""
    text = out.read_text()
    assert text.startswith("# exportflops report: Sequential")
    assert "## Summary of Sequential" in text and re.search(r"\| params +\| +58 \|", text)


@pytest.mark.parametrize(("args", "message"), [
    (["no_such_model"], "is not a built-in example"),
    (["missing/file.py:build"], "no file 'missing/file.py'"),
    (["gpt2", "--input", "1,8:floaty"], "unknown dtype 'floaty'"),
    (["gpt2", "--format", "xml"], "invalid choice: 'xml'"),
])
def test_usage_errors_exit_2_with_one_paragraph(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_failing_factory_exits_1_and_names_the_error(models):
    result = run(f"{models / 'mlp_models.py'}:broken")
    assert result.returncode == 1
    assert "RuntimeError: checkpoint shards missing" in result.stderr
    assert "Traceback" not in result.stderr
    debug = run(f"{models / 'mlp_models.py'}:broken", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_strict_exits_1_on_an_uncounted_op(models):
    target = f"{models / 'mlp_models.py'}:custom"
    assert run(target).returncode == 0
    result = run(target, "--strict")
    assert result.returncode == 1
    assert "exportflops_cli.scale" in result.stderr


def test_help_shows_examples():
    result = run("--help")
    assert result.returncode == 0 and "examples:" in result.stdout
