"""The main job (README command one) runs end to end on a tiny config."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from tests.helpers import tiny_job_config

ROOT = Path(__file__).resolve().parents[2]


def test_captioning_job_prints_shapes_and_throughput(tmp_path, monkeypatch, capsys):
    """The job generates, prepares and loads a dataset, printing batch shapes, samples/s and Ray stats."""
    cfg = tiny_job_config(tmp_path)
    monkeypatch.setattr(sys, "argv", ["captioning_job.py", "--config", str(cfg), "--workdir", str(tmp_path / "run")])
    runpy.run_path(str(ROOT / "jobs" / "captioning_job.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "batch 0: images (8, 3, 32, 32) torch.float32" in out
    assert "samples in" in out and "samples/s" in out
    assert '"samples_read": 40' in out and '"skipped": {}' in out
    assert "EnergonSegmentTasks: " in out and " segment tasks (" in out
    assert (tmp_path / "run" / "dataset" / ".nv-meta" / "dataset.yaml").is_file()
