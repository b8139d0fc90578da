"""Progress: the stage and elapsed seconds on stderr, opt-in in the API, on a
terminal only in the command."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from exportflops import analyze, profile
from exportflops.progress import Progress
from tests.cli_support import ROOT


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.randn(3, 4),)


def stages(text: str) -> list[str]:
    return re.findall(r"^exportflops: (\w+) \(\d+\.\d s\)$", text, flags=re.M)


def test_train_mode_reports_export_count_and_backward_in_order():
    stream = io.StringIO()  # not a terminal: one line per stage
    analyze(*mlp(), mode="train", progress=Progress(stream))
    assert stages(stream.getvalue()) == ["export", "count", "backward"]


def test_the_runtime_pass_adds_warmup_and_timing_and_names_each_stage_once():
    stream = io.StringIO()
    profile(*mlp(), warmup=1, repeat=2, progress=Progress(stream))
    assert stages(stream.getvalue()) == ["export", "count", "warmup", "timing"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_counts_the_warmup_and_timed_runs():
    stream = Terminal()  # a line redrawn in place: every run moves it
    profile(*mlp(), warmup=2, repeat=3, progress=Progress(stream, interval=60))
    drawn = re.findall(r"exportflops: (\w+ \d+/\d+) ", stream.getvalue())
    assert drawn == ["warmup 1/2", "warmup 2/2", "timing 1/3", "timing 2/3", "timing 3/3"]


def test_progress_is_off_by_default(capsys):
    analyze(*mlp(), mode="train")
    assert capsys.readouterr().err == ""


def test_progress_true_writes_to_stderr(capsys):
    analyze(*mlp(), progress=True)
    assert stages(capsys.readouterr().err) == ["export", "count"]


def test_progress_of_another_type_is_refused():
    with pytest.raises(TypeError,
                       match="progress must be True, False or an exportflops.progress.Progress"):
        analyze(*mlp(), progress="yes")


def run_with_stderr(stderr) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "exportflops", "gpt2", "--input", "1,8:int64",
                           "--view", "summary"], stdout=subprocess.PIPE, stderr=stderr,
                          env=env, timeout=300)


def test_the_command_draws_one_updating_line_on_a_terminal_and_erases_it():
    terminal, stderr = pty.openpty()
    done = run_with_stderr(stderr)
    os.close(stderr)
    written = b""
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        written += chunk
    os.close(terminal)
    assert done.returncode == 0
    text = written.decode()
    assert "\n" not in text.replace("\r\n", "")  # redrawn in place, never a new line
    drawn = re.findall(r"exportflops: (\w+) \d+\.\d s", text)
    assert drawn[0] == "build" and "export" in drawn and "count" in drawn
    assert text.endswith("\r\x1b[K")  # erased before the report is printed


def test_the_command_in_a_pipe_prints_nothing_extra():
    done = run_with_stderr(subprocess.PIPE)
    assert done.returncode == 0 and done.stderr == b""
