"""The notebooks under notebooks/ run top to bottom in a fresh kernel, offline.

They build their models on the ``meta`` device (no weights, no download). A cell that raises,
including an ``assert`` on a published figure, makes ``execute`` raise ``CellExecutionError``.
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["nanogpt.ipynb", "llama_budget.ipynb"])
def test_notebook_runs_top_to_bottom(name, monkeypatch):
    # Any Hugging Face Hub access fails instead of downloading (the kernel inherits this).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(cell.execution_count for cell in code_cells)
