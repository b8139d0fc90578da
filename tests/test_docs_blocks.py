"""Every fenced ```python and ```bash / ```sh block of README.md and docs/*.md runs as written.

A Python block runs alone in a fresh interpreter (the repository on ``PYTHONPATH``, a temporary
folder as its working directory, so the files it writes land there). A shell block runs each
command line: an ``exportflops ...`` line in this process through ``exportflops.cli.main`` (no
interpreter start per line), a ``python -m ...`` line in a fresh interpreter. Each must exit 0.

Markers, an HTML comment on the line(s) right above a fence (GitHub shows none of them):

- ``<!-- continues -->``: the block runs after the page's previous Python block that is not
  skipped (and what that one continues), so a page builds its example once for the blocks below.
- ``<!-- skip: reason -->``: the block is not run; the reason is printed (a block that needs CUDA,
  a multi-GPU ``torchrun`` or the whole test suite).
- ``<!-- run-with: OLD => NEW -->``: the block runs with the text OLD replaced by NEW (a smaller
  size for a long example); in a Python block OLD must occur, in a shell block it applies to the
  lines holding it.
- ``<!-- placeholder: WORD -->`` (shell): a line naming WORD (the reader's own file or module,
  such as ``mypkg.models:build``) is not run.

A shell line that starts with ``pip install`` is setup, which CI runs itself (``.ci/run``): it is
skipped with that reason. Any other command fails the test until a marker
says why it is not run. The README's quickstart is run by tests/test_readme.py, against the output
the README prints; it is skipped here so that it runs once. The last test prints how many blocks
and command lines ran and how many were skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->$")
SHELLS = {"bash", "sh", "shell"}
PIP_SKIP = "pip install: setup, which CI runs itself (.ci/run installs the package and its extras)"
QUICKSTART_SKIP = "the README's quickstart: tests/test_readme.py runs it against its printed output"
TIMEOUT_S = 300


@dataclass
class Block:
    page: Path
    line: int
    """The fence's line number, 1-based."""
    lang: str
    code: str
    markers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence or not fence.group(1):
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        found.append(Block(page, index + 1, fence.group(1), "\n".join(lines[index + 1:end]) + "\n",
                           markers_above(lines, index)))
        index = end + 1
    return found


def markers_above(lines: list[str], fence: int) -> dict[str, list[str]]:
    markers: dict[str, list[str]] = {}
    above = fence - 1
    while above >= 0 and (marker := MARKER.match(lines[above].strip())):
        markers.setdefault(marker.group(1), []).append(marker.group(2) or "")
        above -= 1
    unknown = set(markers) - {"continues", "skip", "run-with", "placeholder"}
    assert not unknown, f"{page_line(lines, fence)}: unknown docs-test marker(s) {unknown}"
    return markers


def page_line(lines: list[str], fence: int) -> str:
    return f"line {fence + 1} ({lines[fence]!r})"


ALL = [block for page in PAGES for block in blocks_of(page)]
PYTHON = [block for block in ALL if block.lang in ("python", "py")]
SHELL = [block for block in ALL if block.lang in SHELLS]


def is_quickstart(block: Block) -> bool:
    text = block.page.read_text()
    return block.page.name == "README.md" and "\n## Quickstart\n" in text and (
        block.code in text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0])


def program(block: Block) -> str:
    """The block's code after the blocks it continues, with its run-with replacements."""
    code = block.code
    for change in block.markers.get("run-with", []):
        old, sep, new = change.partition("=>")
        assert sep and old.strip() in code, f"{block.id}: run-with {change!r} matches nothing"
        code = code.replace(old.strip(), new.strip())
    if "continues" not in block.markers:
        return code
    earlier = [b for b in PYTHON if b.page == block.page and b.line < block.line
               and "skip" not in b.markers]
    assert earlier, f"{block.id} is marked <!-- continues --> but no Python block is above it"
    return program(earlier[-1]) + code


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_block_runs(block, tmp_path):
    if "skip" in block.markers:
        pytest.skip("; ".join(block.markers["skip"]))
    if is_quickstart(block):
        pytest.skip(QUICKSTART_SKIP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", program(block)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stderr[-4000:]}"


@dataclass(frozen=True)
class Command:
    block: Block
    line: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.block.page.relative_to(ROOT)}:{self.line}"


def commands() -> list[Command]:
    found = []
    for block in SHELL:
        for offset, text in enumerate(block.code.splitlines(), start=1):
            words = shlex.split(text, comments=True)
            if words:
                found.append(Command(block, block.line + offset, text))
    return found


COMMANDS = commands()


def skip_reason(command: Command) -> str | None:
    markers = command.block.markers
    if "skip" in markers:
        return "; ".join(markers["skip"])
    if command.text.lstrip().startswith("pip install"):
        return PIP_SKIP
    named = [word for word in markers.get("placeholder", []) if word in command.text]
    if named:
        return f"names {named[0]}, a stand-in for the reader's own model"
    return None


def shell_line(command: Command) -> str:
    """The line with its block's run-with replacements that occur in it."""
    text = command.text
    for change in command.block.markers.get("run-with", []):
        old, _, new = change.partition("=>")
        text = text.replace(old.strip(), new.strip())
    return text


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_shell_line_runs(command, tmp_path, monkeypatch, capsys):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    words = shlex.split(shell_line(command), comments=True)
    monkeypatch.chdir(tmp_path)  # --output and --trace files land there
    if words[0] == "exportflops":
        from exportflops.cli import main
        status = main(words[1:])
        assert status == 0, f"{command.id}: exit {status}:\n{capsys.readouterr().err[-4000:]}"
    elif words[:2] == ["python", "-m"]:
        done = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, f"{command.id}: exit {done.returncode}:\n{done.stderr}"
    else:
        pytest.fail(f"{command.id}: the docs test runs exportflops and python -m lines only; "
                    f"mark this block with <!-- skip: reason --> to say why it is not run")


def test_zz_counts_of_blocks_run_and_skipped(request):
    skipped_python = sum("skip" in b.markers or is_quickstart(b) for b in PYTHON)
    skipped_lines = sum(skip_reason(c) is not None for c in COMMANDS)
    summary = (f"docs blocks: {len(PYTHON) - skipped_python} Python blocks run, "
               f"{skipped_python} skipped; {len(COMMANDS) - skipped_lines} shell lines run, "
               f"{skipped_lines} skipped (of {len(SHELL)} shell blocks)")
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown under -q too, not only with -s
            reporter.write_line(summary)
    assert PYTHON and COMMANDS, summary
