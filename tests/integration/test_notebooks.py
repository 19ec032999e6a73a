"""Notebooks run top to bottom in a real Jupyter kernel and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel(path, tmp_path, monkeypatch):
    """Every cell executes without error; the stored notebook has no outputs."""
    nb = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "store notebooks without outputs"
    monkeypatch.setenv("ENERGON_RAY_NOTEBOOK_WORKDIR", str(tmp_path))
    monkeypatch.setenv("ENERGON_RAY_NOTEBOOK_SAMPLES", "80")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "CaptioningSample" in text and "batches; first: ((16, 3, 64, 64)" in text
    assert "PairBatch is PairBatch: True, " in text  # a batch type declared in a cell
