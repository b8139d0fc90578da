"""The notebooks under notebooks/ run top to bottom in a fresh kernel, offline, each draws at
least one picture, and the outputs stored in the file are those of such a run (so the notebook
reads on GitHub as it runs).

They build their models on the ``meta`` device (no weights, no download). A cell that raises,
including an ``assert`` on a published figure, makes ``execute`` raise ``CellExecutionError``.
Stored and fresh outputs are compared by kind (output type, stream name, MIME types), not by
bytes: a PNG's bytes change with the matplotlib release.
"""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib", reason="the notebooks draw with matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_are_the_ones_the_docs_list():
    listed = re.findall(r"\(\.\./notebooks/([\w-]+\.ipynb)\)",
                        (NOTEBOOKS.parent / "docs" / "pictures.md").read_text())
    assert sorted(listed) == NAMES == ["generation.ipynb", "llama_budget.ipynb", "memory.ipynb",
                                       "nanogpt.ipynb", "parallel.ipynb", "quickstart.ipynb",
                                       "roofline.ipynb", "scaling.ipynb", "training.ipynb"]


def _code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _kinds(cell) -> list[tuple]:
    """What a cell shows, by kind: stdout runs merged into one (the kernel may split them),
    stderr left out (a library's warning is no part of the notebook)."""
    kinds: list[tuple] = []
    for output in cell.outputs:
        if output.output_type == "stream":
            if output.name == "stdout" and kinds[-1:] != [("stream", "stdout")]:
                kinds.append(("stream", "stdout"))
        else:
            kinds.append((output.output_type, *sorted(output.get("data", {}))))
    return kinds


def _images(notebook) -> int:
    return sum("image/png" in output.get("data", {})
               for cell in _code_cells(notebook) for output in cell.outputs)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom_draws_and_stores_its_run(name, monkeypatch):
    # Any Hugging Face Hub access fails instead of downloading (the kernel inherits this).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    code_cells = _code_cells(notebook)
    assert code_cells and all(cell.execution_count for cell in code_cells)
    assert _images(notebook) >= 1, f"{name} draws no picture"
    # The stored outputs are a run's: counted 1, 2, ... in order, the same kinds cell by cell.
    assert [cell.execution_count for cell in _code_cells(stored)] == list(
        range(1, len(code_cells) + 1)), f"{name} is stored without a top-to-bottom run"
    assert [_kinds(cell) for cell in _code_cells(stored)] == [_kinds(cell) for cell in code_cells]
    assert _images(stored) == _images(notebook)


def test_the_pictures_share_the_html_pages_palette():
    plotly = pytest.importorskip("plotly", reason="the HTML page's colors come from plotly")
    plotly_io = pytest.importorskip("plotly.io")
    from exportflops.render.palette import PALETTE, matplotlib_style

    # The page's figures use plotly's default template, whose colorway is this palette.
    assert list(PALETTE) == plotly.colors.qualitative.Plotly
    colorway = plotly_io.templates["plotly"].layout.colorway
    assert [c.upper() for c in colorway] == list(PALETTE)
    assert all(color in matplotlib_style()["axes.prop_cycle"] for color in PALETTE)


def test_ticks_are_written_as_the_tables_write_counts():
    from exportflops.render.palette import tick_label

    # 1.5e9 bytes = 1.50 x 10^9: the G prefix, two decimals; 2048 = 2.048 x 10^3 -> 2.05 k
    assert tick_label("B")(1.5e9, 0) == "1.50 GB"
    assert tick_label()(2048.0, 0) == "2.05 k"
    assert tick_label()(0.0, 0) == "0"
