"""``jobs/train_captioning.py``: options that would fail late or do nothing are usage errors (exit 2)
before Ray starts (this tier forbids ``ray.init``), and a run with a checkpoint is resumed only with
``--resume`` (saying from which step) or started over only with ``--fresh``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import NO_CLUSTER_AT_PORT_1, last_error_line_without_a_cluster, load_job, usage_error



def _job():
    return load_job("train_captioning")


_usage_error = usage_error


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--steps", "0"], "argument --steps: expected an integer >= 1, got 0"),
        (["--checkpoint-every", "0"], "argument --checkpoint-every: expected an integer >= 1, got 0"),
        (["--batch-size", "-1"], "argument --batch-size: expected an integer >= 1, got -1"),
        (["--fail-at", "3", "--workers", "1"], "--fail-at 3 kills train worker 1, so it needs --workers 2 or more, got --workers 1"),
        (["--fail-at", "24"], "--fail-at 24 is never reached: --steps 24 trains steps 0-23"),
        (["--name", "../other"], "--name must be a folder name (no '/'), got '../other'"),
        (["--resume", "--fresh"], "argument --fresh: not allowed with argument --resume"),
    ],
)
def test_train_captioning_refuses_options_that_fail_late_or_do_nothing(capsys, argv, expected):
    """--steps 0 (a TypeError after training), --checkpoint-every 0 (ZeroDivisionError in the workers), --fail-at
    with one worker (silently nothing): usage errors naming the option and the value."""
    assert _usage_error(capsys, _job().parse_args, argv) == expected


def test_train_captioning_help_gives_every_option_a_text_and_its_default():
    """--help says what each option does, and the value of each that has a default (--batch-size had no
    text, --samples, --steps, --workers, --cpus and --checkpoint-every no default)."""
    parser = _job()._parser()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert [a.dest for a in options if not a.help] == []
    with_default = [a.dest for a in options if a.default not in (None, False)]
    assert with_default == ["workdir", "name", "samples", "steps", "batch_size", "workers", "cpus", "checkpoint_every"]
    assert [d for d in with_default if "%(default)s" not in parser._option_string_actions["--" + d.replace("_", "-")].help] == []


def _run_with_checkpoint(run_dir: Path, step: int, options: dict) -> Path:
    """A run folder as Ray Train and the job leave it: the snapshot's latest checkpoint is at ``step``."""
    folder = run_dir / f"checkpoint_{step}"
    folder.mkdir(parents=True)
    latest = {"version": 0, "checkpoint_dir_name": folder.name, "metrics": {"loss": 0.1, "step": step}}
    (run_dir / "checkpoint_manager_snapshot.json").write_text(json.dumps({"checkpoint_results": [latest], "latest_checkpoint_result": latest}))
    (run_dir / "job_options.json").write_text(json.dumps(options))
    return folder


OPTIONS = {"samples": 240, "batch_size": 8, "workers": 2}


def test_a_run_without_a_checkpoint_starts_at_step_0(tmp_path):
    """No checkpoint in the run folder: train every step, with or without --resume, and say so."""
    job = _job()
    plan = job.plan_run(tmp_path / "run", "r", 6, OPTIONS)
    assert (plan.start, plan.checkpoint, plan.delete) == (0, None, False)
    assert plan.message == f"starting run 'r' in {tmp_path / 'run'}: training steps 0-5"
    resumed = job.plan_run(tmp_path / "run", "r", 6, OPTIONS, resume=True)
    assert resumed.start == 0 and "(--resume: it has no checkpoint yet)" in resumed.message


def test_a_run_with_a_checkpoint_is_neither_resumed_nor_overwritten_unasked(tmp_path, capsys):
    """The second run in a work dir (it silently resumed): a usage error naming the run, its step and the choices, before Ray."""
    job = _job()
    _run_with_checkpoint(tmp_path / "runs" / "train_captioning", 3, OPTIONS)
    message = _usage_error(capsys, job.main, ["--workdir", str(tmp_path), "--steps", "6"])
    assert message == (f"{tmp_path / 'runs' / 'train_captioning'} already holds run 'train_captioning', with a checkpoint at "
                       "step 3: pass --resume to continue it, --fresh to delete it and start over, or another --name or --workdir")  # fmt: skip


def test_resume_continues_from_the_step_after_the_checkpoint(tmp_path):
    """--resume: train the steps after the checkpoint's, and say from which checkpoint."""
    folder = _run_with_checkpoint(tmp_path, 3, OPTIONS)
    plan = _job().plan_run(tmp_path, "r", 6, OPTIONS, resume=True)
    assert (plan.start, plan.checkpoint, plan.delete) == (4, folder, False)
    assert plan.message == f"resuming run 'r' from its checkpoint at step 3 ({folder}): training steps 4-5"


def test_resume_with_other_options_or_no_steps_left_is_refused(tmp_path):
    """--resume with another --batch-size (a StateError in the workers) or no step left to train: the reason and the way out."""
    job = _job()
    folder = _run_with_checkpoint(tmp_path, 5, OPTIONS)
    with pytest.raises(job.RunConflict) as caught:
        job.plan_run(tmp_path, "r", 10, {**OPTIONS, "batch_size": 4}, resume=True)
    assert str(caught.value) == (f"cannot resume run 'r' from its checkpoint at step 5 ({folder}) with --batch-size 4 "
                                 "(the run has 8): resume with the run's values, or pass --fresh")  # fmt: skip
    with pytest.raises(job.RunConflict, match=r"run 'r' has already trained steps 0-5 .*: --steps 6 leaves nothing to train; pass --steps above 6, or --fresh"):
        job.plan_run(tmp_path, "r", 6, OPTIONS, resume=True)


def test_fresh_deletes_the_run_and_its_key_logs(tmp_path):
    """--fresh: the old run folder and key logs go, the new options are recorded, training starts at step 0."""
    job = _job()
    run_dir, log_dir = tmp_path / "run", tmp_path / "logs"
    _run_with_checkpoint(run_dir, 5, OPTIONS)
    log_dir.mkdir()
    (log_dir / "keys_rank0.jsonl").write_text("{}\n")
    (log_dir / "failed_once").write_text("1")
    plan = job.plan_run(run_dir, "r", 6, {**OPTIONS, "batch_size": 4}, fresh=True)
    assert (plan.start, plan.delete) == (0, True) and "(--fresh: deleting its checkpoint at step 5)" in plan.message
    job.start_run(plan, run_dir, log_dir, {**OPTIONS, "batch_size": 4})
    assert sorted(p.name for p in run_dir.iterdir()) == ["job_options.json"] and not any(log_dir.iterdir())
    assert json.loads((run_dir / "job_options.json").read_text())["batch_size"] == 4


def test_train_captioning_refuses_a_dataset_of_other_samples(tmp_path, capsys):
    """WORKDIR/dataset was generated with --samples 12; --samples 16 stops before Ray with a usage
    error naming both counts (it trained on the 12 silently before), and no run folder is made."""
    from energon_ray.tasks.run import synthetic_captioning

    synthetic_captioning(tmp_path / "dataset", 12, 40, (96, 72), split_ratio=(1, 0, 0), progress=False)
    message = _usage_error(capsys, _job().main, ["--workdir", str(tmp_path), "--samples", "16"])
    assert message.startswith(f"{tmp_path / 'dataset'}: holds a synthetic dataset written with other parameters (num_samples was 12, is now 16)")
    assert not (tmp_path / "runs").exists()


def test_train_captioning_with_a_workdir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    """--workdir naming a file stopped the job with a NotADirectoryError traceback; now a usage error
    (exit 2) that names the option and the path, before Ray."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    message = _usage_error(capsys, _job().main, ["--workdir", str(afile), "--steps", "1"])
    assert message.startswith(f"--workdir {afile} / --log-dir {afile / 'logs'}: cannot write there: ")
    assert "Not a directory" in message


def test_train_captioning_names_a_cluster_address_nothing_answers_at(tmp_path):
    """RAY_ADDRESS=127.0.0.1:1 (nothing listens): exit 1 with a line naming the address (ray.init waited
    for that cluster without end; nothing else stopped the job)."""
    job = str(Path(__file__).resolve().parents[2] / "jobs" / "train_captioning.py")
    said = last_error_line_without_a_cluster(job, "--workdir", str(tmp_path), "--samples", "40", "--steps", "2")
    assert said == f"train_captioning: {NO_CLUSTER_AT_PORT_1}"
