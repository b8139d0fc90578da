"""--progress: the command's stages on stderr, one line each with the seconds since it began,
also where stderr is no terminal (a pipe, CI, a benchmark reading them: benchmarks/command.py),
so that where the time goes stays visible."""

from __future__ import annotations

import re

import pytest

from exportflops.cli import main
from exportflops.errors import MissingExtraError

pytest.importorskip("transformers")

LINE = re.compile(r"exportflops: (\w+) \((\d+\.\d) s\)")


def test_progress_names_each_stage_of_an_hf_model_in_order(capsys):
    # transformers imported, the model built, torch.export's capture, the count, the table.
    assert main(["hf:gpt2", "--layers", "1", "--progress"]) == 0
    lines = [LINE.fullmatch(line) for line in capsys.readouterr().err.splitlines()]
    assert all(lines)
    assert [line[1] for line in lines] == ["imports", "build", "export", "count", "render"]
    seconds = [float(line[2]) for line in lines]
    assert seconds == sorted(seconds)


def test_without_progress_a_pipe_gets_no_stage_lines(capsys):
    assert main(["hf:gpt2", "--layers", "1", "--format", "json"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("raised", "code", "words"), [
    (RuntimeError("no room for the tree"), 1,
     "exportflops: rendering the report of cli_models:mlp as table failed: RuntimeError: no "
     "room for the tree"),
    (MissingExtraError("the HTML report needs plotly: pip install 'exportflops[html]'"), 2,
     "exportflops: error: the HTML report needs plotly"),
], ids=["a view that fails", "a missing package"])
def test_a_report_that_cannot_be_drawn_is_told_after_the_last_stage(
        models, monkeypatch, capsys, raised, code, words):
    """Rendering is a stage, and its failure is told once the stages are done, as before."""
    import exportflops.cli as cli

    def to_format(results, format, options):
        raise raised

    monkeypatch.setattr(cli, "to_format", to_format)
    monkeypatch.chdir(models)
    assert main(["cli_models:mlp", "--progress"]) == code
    err = capsys.readouterr().err.splitlines()
    assert LINE.fullmatch(err[-2])[1] == "render"
    assert err[-1].startswith(words)
