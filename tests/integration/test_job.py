"""The main job (README command one) runs end to end on a tiny config."""

from __future__ import annotations

import re
import runpy
import sys
import time
from pathlib import Path

from tests.helpers import NO_CLUSTER_AT_PORT_1, last_error_line_without_a_cluster, tiny_job_config

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


def test_captioning_job_times_the_first_batch_from_asking_for_the_loader(tmp_path, monkeypatch, capsys):
    """get_loader starts the first pass at once, so the job's clock starts before it: a get_loader that
    takes 0.5 s longer (a cold start) is in "s to the first batch" (it said 0.0 s, timed from iter())."""
    import energon_ray

    real, took = energon_ray.get_loader, []

    def slow_get_loader(*args, **kwargs):
        start = time.perf_counter()
        loader = real(*args, **kwargs)
        time.sleep(0.5)
        took.append(time.perf_counter() - start)
        return loader

    monkeypatch.setattr(energon_ray, "get_loader", slow_get_loader)
    cfg = tiny_job_config(tmp_path)
    monkeypatch.setattr(sys, "argv", ["captioning_job.py", "--config", str(cfg), "--workdir", str(tmp_path / "run")])
    runpy.run_path(str(ROOT / "jobs" / "captioning_job.py"), run_name="__main__")
    out = capsys.readouterr().out
    seconds = float(re.search(r"\(([\d.]+) s to the first batch\)", out).group(1))
    assert len(took) == 1 and seconds >= took[0] - 0.05, (took, out)


def test_captioning_job_names_a_cluster_address_nothing_answers_at(tmp_path):
    """RAY_ADDRESS naming a port nobody listens on (a head not started): one line naming the address,
    exit status 1 (ray.init waited for that cluster without end)."""
    cfg = tiny_job_config(tmp_path)
    said = last_error_line_without_a_cluster(str(ROOT / "jobs" / "captioning_job.py"), "--config", str(cfg), "--workdir", str(tmp_path / "run"))
    assert said == f"captioning_job: {NO_CLUSTER_AT_PORT_1}"
