"""``jobs/train_captioning.py`` with a real ``TorchTrainer`` (2 train workers on the session's 2-CPU
Ray, as the job runs on a Ray that is already up): the loss goes down, and a train worker that dies once resumes from the last
checkpoint on exactly the batches an uninterrupted run trains on (each rank's loader, built here
with that rank's ``WorkerConfig``, tells which: batches do not depend on the training)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "train_captioning.py"


def _job():
    spec = importlib.util.spec_from_file_location("train_captioning", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _run(workdir: Path, log_dir: Path, capsys, monkeypatch, *extra: str) -> str:
    log_dir.mkdir(parents=True)
    argv = [str(JOB), "--workdir", str(workdir), "--steps", "10", "--checkpoint-every", "3", "--log-dir", str(log_dir), *extra]
    monkeypatch.setattr(sys, "argv", argv)
    _job().main()
    return capsys.readouterr().out


def _keys(log_dir: Path) -> dict:
    """``(rank, step) -> keys`` as finally trained (a step done again after a restart overwrites)."""
    out = {}
    for rank in (0, 1):
        for line in (log_dir / f"keys_rank{rank}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            out[(rank, entry["step"])] = (entry["keys"], entry["resumed"])
    return out


def _expected_keys(workdir: Path) -> dict:
    """``(rank, step) -> keys`` of an uninterrupted run: each rank's loader, as the job builds it."""
    import energon_ray as er

    job = _job()
    out = {}
    for rank in (0, 1):
        config = {"path": str(workdir / "dataset"), "batch_size": 8}
        loader = job.build_loader(config, er.WorkerConfig(rank=rank, world_size=2, num_workers=2))
        batches = iter(loader)
        for step in range(10):
            out[(rank, step)] = list(next(batches).__keys__)
        loader.close()
    return out


def test_torch_trainer_learns_and_a_dead_worker_resumes_on_the_same_batches(tmp_path, ray_session, capsys, monkeypatch):
    out = _run(tmp_path / "b", tmp_path / "logs_b", capsys, monkeypatch, "--fail-at", "6")  # last checkpoint before: step 5
    first, last = map(float, re.search(r"loss: first 3 steps ([\d.]+), last 3 steps ([\d.]+)", out).groups())
    assert last < 0.5 * first, out
    assert (tmp_path / "logs_b" / "failed_once").exists()
    got = _keys(tmp_path / "logs_b")
    expected = _expected_keys(tmp_path / "b")
    assert sorted(got) == [(r, s) for r in (0, 1) for s in range(10)]
    ranks = [set(k for s in range(10) for k in expected[(r, s)]) for r in (0, 1)]
    assert not ranks[0] & ranks[1]  # each rank its own stream
    assert {key: keys for key, (keys, _) in got.items()} == expected
    # resumed after the checkpoint of step 5, or of step 2 if Ray Train had not registered that one yet
    resumed = {step for (rank, step), (_, again) in got.items() if again}
    assert resumed in (set(range(6, 10)), set(range(3, 10)))


def test_a_second_run_resumes_only_with_resume_and_counts_the_steps_it_trains(tmp_path, ray_session, capsys, monkeypatch):
    """Re-running into a work dir with a checkpoint stops with a usage error; --resume trains the steps after the
    checkpoint, on the batches an uninterrupted run takes there, and prints which steps it trained."""
    job = _job()
    argv = ["--workdir", str(tmp_path / "w"), "--workers", "1", "--samples", "80", "--checkpoint-every", "2"]
    job.main([*argv, "--steps", "4"])
    assert "trained steps 0-3 (4 steps) on 1 workers" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        job.main([*argv, "--steps", "6"])
    assert refused.value.code == 2
    assert "already holds run 'train_captioning', with a checkpoint at step 3: pass --resume" in capsys.readouterr().err
    job.main([*argv, "--steps", "6", "--resume"])
    out = capsys.readouterr().out
    assert "resuming run 'train_captioning' from its checkpoint at step 3 (" in out, out
    assert "trained steps 4-5 (2 steps, resumed from the checkpoint at step 3) on 1 workers" in out, out
    import energon_ray as er

    loader = job.build_loader({"path": str(tmp_path / "w" / "dataset"), "batch_size": 8}, er.WorkerConfig(rank=0, world_size=1, num_workers=2))
    batches = iter(loader)
    expected = [list(next(batches).__keys__) for _ in range(6)]
    loader.close()
    logged = [json.loads(line) for line in (tmp_path / "w" / "logs" / "keys_rank0.jsonl").read_text().splitlines()]
    assert [(e["step"], e["resumed"]) for e in logged] == [(0, False), (1, False), (2, False), (3, False), (4, True), (5, True)]
    assert [e["keys"] for e in logged] == expected
