"""The README as a landing page: its quickstart prints what it shows, its links resolve, and it
stays short (the reference lives in docs/).

The golden of the quickstart is the README's own ```text block right after the ```python block:
the test runs that block in a fresh interpreter from the repository root and compares stdout
with it, line by line, trailing spaces aside. A line naming the torch version (a summary's
versions row) differs between torch releases and is compared as a placeholder on both sides.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 210

# CI runs the second line literally (.ci/run) and tests/cli/test_cli.py the first's analysis.
FIRST_COMMANDS = (
    "pip install torch==2.13.0 && pip install -e . && exportflops gpt2",
    'pip install torch==2.13.0 && pip install -e ".[test]" && ruff check exportflops tests '
    "benchmarks && python -m pytest -q -n 2",
)

TORCH_VERSION_LINE = re.compile(r"\btorch \d+\.\d+\S*")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def quickstart() -> tuple[str, str]:
    """The README's quickstart: its python block and the text block that follows it."""
    text = README.read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return code, shown


def normalized(output: str) -> list[str]:
    lines = [line.rstrip() for line in output.strip("\n").splitlines()]
    return ["<torch version line>" if TORCH_VERSION_LINE.search(line) else line
            for line in lines]


def test_readme_starts_with_the_two_commands_ci_runs():
    block = re.match(r"# exportflops\n.*?```bash\n(.*?)```", README.read_text(), re.S)
    assert block, "the README's first fenced block is the bash block of the two commands"
    commands = [line for line in block.group(1).splitlines()
                if line.strip() and not line.startswith("#")]
    assert tuple(commands) == FIRST_COMMANDS


def test_readme_names_the_tested_torch_releases():
    head = README.read_text().split("\n## ", 1)[0]
    for fact in ("2.13.0", "2.14.1", "2.15.0", "tests/core_subset.txt", "exportflops --version",
                 "exportflops/torch_internals.py", "TorchFeatureError"):
        assert fact in head, fact


def test_quickstart_prints_what_the_readme_shows():
    code, shown = quickstart()
    assert len(code.strip().splitlines()) <= 12
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert normalized(done.stdout) == normalized(shown)


def test_readme_is_a_landing_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"{len(lines)} lines"


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http, https, mailto) or an anchor on the same page
        path, _, anchor = target.partition("#")
        file = page.parent / path
        if not file.exists() or (anchor and file.suffix == ".md"
                                 and anchor not in anchors(file)):
            missing.append(target)
    assert not missing, missing


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lowercase, punctuation dropped, spaces as -."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_docs_page_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name
