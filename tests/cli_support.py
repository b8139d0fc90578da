"""What the command's tests share: a module of model factories written for them, and running
the installed ``exportflops`` console script on this checkout's package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from exportflops import Report

ROOT = Path(__file__).resolve().parents[1]

FACTORIES = textwrap.dedent("""
    import sys

    import torch
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.randn(3, 4),)

    def bare():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    class Pair(nn.Module):
        def forward(self, x, y):
            return x @ y.T

    class Repeat(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, times=1):
            for _ in range(times):
                x = self.fc(x)
            return x

    def repeat(device):
        return Repeat().to(device), (torch.zeros(2, 4, device=device),)

    def broken():
        raise RuntimeError("checkpoint shards missing")

    def not_a_model():
        return 42, ()

    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    def data_dependent():
        return DataDependent(), (torch.ones(2, 2),)

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

    def three():
        return mlp()[0], (torch.randn(2, 8),), {}

    class Noisy(nn.Module):
        def forward(self, x):
            import logging, warnings
            warnings.warn("a warning raised while exporting")
            logging.getLogger("torch._dynamo.noisy").error("E an error line a torch logger wrote")
            print("printed to stderr", file=sys.stderr)
            return x * 2

    def noisy():
        return Noisy(), (torch.randn(2, 2),)
""")


def run(*args: str, cwd: Path | None = None, module: bool = False) -> subprocess.CompletedProcess:
    """``exportflops ARGS`` (or ``python -m exportflops ARGS``) on this checkout's package."""
    if module:
        command = [sys.executable, "-m", "exportflops"]
    else:
        script = shutil.which("exportflops")
        assert script, "the exportflops console script is not installed (pip install -e .)"
        command = [script]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def report_of(result: subprocess.CompletedProcess) -> Report:
    assert result.returncode == 0, result.stderr
    return Report.model_validate_json(result.stdout)


def one_paragraph(stderr: str) -> bool:
    return bool(stderr.strip()) and "\n\n" not in stderr.strip() and "Traceback" not in stderr


def write_models(folder: Path) -> Path:
    """``folder/cli_models.py``, the factories, importable as ``cli_models:NAME``."""
    (folder / "cli_models.py").write_text(FACTORIES)
    return folder


def named_inputs(model, args: tuple, kwargs: dict) -> dict:
    """The example inputs ``hf:`` made for ``model``, each by its forward parameter's name."""
    import inspect

    return dict(zip(inspect.signature(model.forward).parameters, args)) | kwargs


def analyzes_with_every_op_counted(model_type: str, device=None, layers: int = 1) -> None:
    """``hf:model_type`` at ``layers`` layers on ``device`` (meta) analyzes to some FLOPs with
    no uncounted op."""
    import torch

    from exportflops import analyze
    from exportflops.hf.models import hf_model

    report = analyze(*hf_model(model_type, device or torch.device("meta"), None, layers=layers))
    assert report.total.flops != 0
    assert not report.uncounted


def input_shapes(model_type: str, names) -> dict:
    """The shapes of the inputs among ``names`` that ``hf:model_type`` makes at one layer on
    meta, batch 1, default length."""
    import torch

    from exportflops.hf.models import hf_model

    named = named_inputs(*hf_model(model_type, torch.device("meta"), None, layers=1))
    return {name: tuple(named[name].shape) for name in names if name in named}
