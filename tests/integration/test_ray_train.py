"""``jobs/train_captioning.py`` with a real ``TorchTrainer`` (2 train workers on the session's 2-CPU
Ray, as the job runs on a Ray that is already up): the loss goes down, and a train worker that dies once resumes from the last
checkpoint on exactly the batches an uninterrupted run trains on (each rank's loader, built here
with that rank's ``WorkerConfig``, tells which: batches do not depend on the training); a second run into
the same folder continues only with ``--resume``. One test: every ``fit()`` starts a worker group (seconds)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "train_captioning.py"


def _job():
    spec = importlib.util.spec_from_file_location("train_captioning", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _keys(log_dir: Path) -> dict:
    """``(rank, step) -> keys`` as finally trained (a step done again after a restart overwrites)."""
    out = {}
    for rank in (0, 1):
        for line in (log_dir / f"keys_rank{rank}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            out[(rank, entry["step"])] = (entry["keys"], entry["resumed"])
    return out


def _expected_keys(workdir: Path, steps: int) -> dict:
    """``(rank, step) -> keys`` of an uninterrupted run: each rank's loader, as the job builds it."""
    import energon_ray as er

    job = _job()
    out = {}
    for rank in (0, 1):
        config = {"path": str(workdir / "dataset"), "batch_size": 8}
        loader = job.build_loader(config, er.WorkerConfig(rank=rank, world_size=2, num_workers=2))
        batches = iter(loader)
        for step in range(steps):
            out[(rank, step)] = list(next(batches).__keys__)
        loader.close()
    return out


def test_torch_trainer_learns_a_dead_worker_resumes_and_a_second_run_resumes_only_with_resume(tmp_path, ray_session, capsys):
    """One run of 10 steps whose worker 1 dies at step 6; then the same run again stops with a usage
    error, and --resume trains the steps after its last checkpoint (step 8), on the batches an
    uninterrupted run takes there, and prints which steps it trained."""
    job = _job()
    workdir = tmp_path / "w"
    logs = workdir / "logs"
    argv = ["--workdir", str(workdir), "--checkpoint-every", "3"]  # checkpoints after steps 2, 5, 8
    job.main([*argv, "--steps", "10", "--fail-at", "6"])
    out = capsys.readouterr().out
    first, last = map(float, re.search(r"loss: first 3 steps ([\d.]+), last 3 steps ([\d.]+)", out).groups())
    assert last < 0.5 * first, out
    assert "trained steps 0-9 (10 steps) on 2 workers" in out, out
    assert (logs / "failed_once").exists()
    got = _keys(logs)
    expected = _expected_keys(workdir, 12)
    assert sorted(got) == [(r, s) for r in (0, 1) for s in range(10)]
    ranks = [set(k for s in range(12) for k in expected[(r, s)]) for r in (0, 1)]
    assert not ranks[0] & ranks[1]  # each rank its own stream
    assert {key: keys for key, (keys, _) in got.items()} == {key: expected[key] for key in got}
    # resumed after the checkpoint of step 5, or of step 2 if Ray Train had not registered that one yet
    resumed = {step for (rank, step), (_, again) in got.items() if again}
    assert resumed in (set(range(6, 10)), set(range(3, 10)))

    with pytest.raises(SystemExit) as refused:
        job.main([*argv, "--steps", "12"])
    assert refused.value.code == 2
    assert "already holds run 'train_captioning', with a checkpoint at step 8: pass --resume" in capsys.readouterr().err
    job.main([*argv, "--steps", "12", "--resume"])
    out = capsys.readouterr().out
    assert "resuming run 'train_captioning' from its checkpoint at step 8 (" in out, out
    assert "trained steps 9-11 (3 steps, resumed from the checkpoint at step 8) on 2 workers" in out, out
    got = _keys(logs)
    assert sorted(got) == [(r, s) for r in (0, 1) for s in range(12)]
    assert {key: keys for key, (keys, _) in got.items()} == expected
    assert {step for (rank, step), (_, again) in got.items() if again} == resumed | {9, 10, 11}


def test_more_workers_than_the_private_ray_holds_is_a_usage_error(tmp_path, ray_session, capsys):
    """--workers 9 at 0.25 CPU each on the session's 2-CPU private Ray: a usage error (exit 2) naming
    --workers and what the nodes hold (TorchTrainer waited for the 9th worker without end)."""
    import torch

    from tests.helpers import usage_error

    message = usage_error(capsys, _job().main, ["--workdir", str(tmp_path), "--samples", "40", "--steps", "2", "--workers", "9"])
    assert message.startswith("a train worker (--workers 9) asks for CPU 0.25" + (", GPU 1, 9 at once" if torch.cuda.is_available() else ", 9 at once"))
    assert message.endswith("; this private local Ray has no autoscaler to add a node, so it would wait forever")
