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


def test_captioning_job_names_a_cluster_address_nothing_answers_at(tmp_path):
    """RAY_ADDRESS naming a port nobody listens on (a head not started): one line naming the address,
    exit status 1 (ray.init waited for that cluster without end)."""
    import os
    import subprocess

    cfg = tiny_job_config(tmp_path)
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "captioning_job.py"), "--config", str(cfg), "--workdir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        "captioning_job: energon_ray: no Ray cluster at 127.0.0.1:1 (Connection refused): start one there (`ray start --head`), "
        "or give another address (--address / RAY_ADDRESS); without one a private local Ray is started"
    )
    assert "Traceback" not in proc.stderr
