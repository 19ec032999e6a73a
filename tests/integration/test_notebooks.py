"""Notebooks run top to bottom in a real Jupyter kernel, draw their pictures, and are stored without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from energon_ray.format.jsonl import prepare_jsonl

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

#: Per notebook: strings its printed output holds, at least how many image/png outputs (matplotlib
#: figures) and how many text/html outputs with an <img> (rich display of a sample or batch) it makes.
EXPECTED = {
    "explore_dataset.ipynb": dict(
        stream=["CaptioningSample", "batches; first: ((16, 3, 64, 64)", "PairBatch is PairBatch: True, "],
        png=1,  # the grid of images with captions
        html_img=2,  # a sample, a batch
    ),
    "video_and_audio.ipynb": dict(
        stream=["frames (3, 8, 3, 48, 64) | What moves across video 0? -> a white square", "audio (4, 4000) ['tone 220 Hz'"],
        png=2,  # the strip of frames, the waveforms
        html_img=1,  # the video batch as a grid of frames
    ),
    "blends_and_packing.ipynb": dict(
        # the 320 documents of this run are packed, not the corpus an earlier run left (1 row, 3% real)
        stream=["captions_a: ", "% of 200 steps (weight 70%)", "packed: 54 rows for 320 documents, 92% of tokens are real", "(one document per row: 320 rows, "],
        png=2,  # the share of each source over steps, the histogram of pack efficiency
        html_img=0,  # a packed text batch: text/html without images
    ),
}


def test_every_notebook_states_its_expected_output():
    """Each notebook in notebooks/ has an entry in EXPECTED (and no entry is stale)."""
    assert sorted(p.name for p in NOTEBOOKS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_a_notebooks_default_work_dir_is_ignored_by_git(path):
    """Jupyter runs a kernel in its notebook's folder: the data a notebook makes in its default
    WORKDIR (notebooks/runs/notebook/...) are ignored by git (only the top-level runs/ was: every run
    left shards and indexes as untracked files beside the notebooks)."""
    import re
    import subprocess

    source = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    defaults = re.findall(r'os\.environ\.get\("ENERGON_RAY_NOTEBOOK_WORKDIR", "([^"]+)"\)', source)
    assert len(defaults) == 1, defaults
    made = (path.parent / defaults[0] / "dataset" / "shard_000000.tar").relative_to(ROOT).as_posix()
    checked = subprocess.run(["git", "check-ignore", "--no-index", "-v", made], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, f"{made} is not ignored: {checked.stderr}"


@pytest.fixture(scope="module")
def executed(ray_session, tmp_path_factory):
    """Every notebook executed, all at once, each in its own kernel and folder (the kernels start and
    import side by side): notebook name -> (its stored cells had no outputs, the executed notebook),
    or the exception its run raised."""
    import asyncio

    import ray

    # the kernels attach to the session's Ray (as a notebook on a cluster would) instead of starting their own
    env = dict(os.environ, ENERGON_RAY_NOTEBOOK_SAMPLES="80", RAY_ADDRESS=ray.get_runtime_context().gcs_address)

    async def run(path: Path):
        nb = nbformat.read(path, as_version=4)
        stored_without_outputs = all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
        workdir = tmp_path_factory.mktemp(path.stem)
        if path.name == "blends_and_packing.ipynb":  # a corpus an earlier run (other NUM_SAMPLES) left in WORKDIR
            (workdir / "corpus.jsonl").write_text('{"text": "left by an earlier run"}\n')
            prepare_jsonl(workdir / "corpus.jsonl", progress=False)
        client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}})
        await client.async_execute(env=dict(env, ENERGON_RAY_NOTEBOOK_WORKDIR=str(workdir)))
        return stored_without_outputs, nb

    async def run_all():
        return await asyncio.gather(*(run(path) for path in NOTEBOOKS), return_exceptions=True)

    return dict(zip((path.name for path in NOTEBOOKS), asyncio.run(run_all())))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel(path, executed):
    """Every cell executes without error or a line on stderr (Ray's import printed tqdm's "IProgress not
    found" and "Missing packages: ['ipywidgets']" in a kernel without ipywidgets, and attaching to a cluster
    "Connecting to existing Ray cluster"); the stored notebook has no outputs; its figures and rich displays are made."""
    result = executed[path.name]
    if isinstance(result, BaseException):
        raise result
    stored_without_outputs, nb = result
    assert stored_without_outputs, "store notebooks without outputs"
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    said = [o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not said, f"{path.name}: printed on stderr: {said}"
    expected = EXPECTED[path.name]
    for needle in expected["stream"]:
        assert needle in text, f"{path.name}: {needle!r} not printed"
    rich = [o["data"] for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
    png = sum("image/png" in data for data in rich)
    html_img = sum("<img" in data.get("text/html", "") for data in rich)
    assert png >= expected["png"], f"{path.name}: {png} image/png outputs, expected at least {expected['png']}"
    assert html_img >= expected["html_img"], f"{path.name}: {html_img} text/html outputs with <img>, expected at least {expected['html_img']}"
    assert any("text/html" in data for data in rich), f"{path.name}: no rich display of a sample or batch"
