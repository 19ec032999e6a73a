"""``jobs/prepare_job.py`` (Ray tasks over shards) writes byte for byte what ``energon-ray prepare`` writes."""

from __future__ import annotations

import json
import runpy
import shutil
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from energon_ray.cli.main import main as cli
from energon_ray.synthetic import write_captioning_dataset
from tests.helpers import ONE_PROCESS

ROOT = Path(__file__).resolve().parents[2]
FIELD_MAP = json.dumps({"image": "jpg", "caption": "txt"})
SHARDS = [f"shards/shard_{i:04d}.tar" for i in range(6)]


@pytest.fixture(scope="module")
def job_main():
    """The job's ``main(argv)``, run in this process on the session's Ray."""
    return runpy.run_path(str(ROOT / "jobs" / "prepare_job.py"), run_name="prepare_job")["main"]


def _twins(tmp_path: Path):
    """Six shards of three real-JPEG captioning samples, copied to ``cli/`` and ``job/``."""
    write_captioning_dataset(tmp_path / "cli", 18, 3, image_size=(16, 12))
    shutil.copytree(tmp_path / "cli", tmp_path / "job")
    return tmp_path / "cli", tmp_path / "job"


def _files(root: Path):
    """Every file under ``.nv-meta/`` and every ``.tar.idx``, relative to ``root``."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tar"))


def _assert_same_files(a: Path, b: Path, expected) -> None:
    assert _files(a) == _files(b) == sorted(expected)
    for name in expected:
        if name != ".nv-meta/index.uuid":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # Like Energon, every prepare writes a fresh index.uuid.
    uuids = {uuid.UUID((root / ".nv-meta/index.uuid").read_text()) for root in (a, b)}
    assert len(uuids) == 2


@pytest.mark.parametrize(
    "args, meta, indexed",
    [
        (["--split-ratio", "4,1,1", "--sample-type", "CaptioningSample", "--field-map", FIELD_MAP],
         ["dataset.yaml"], SHARDS),
        (["--split-ratio", "1,1,1", "--shuffle-tars", "--exclude", "shard_0005", "--sample-type", "CaptioningSample",
          "--dataset-yaml-name", "ds.yaml"], ["ds.yaml", "sample_loader.py"], SHARDS[:5]),
        (["--split-parts", "train:shards/shard_000[0-3]", "--split-parts", "val:shards/shard_000{4,5}"], [], SHARDS),
    ],
)  # fmt: skip
def test_job_writes_the_clis_nv_meta_and_tar_idx_byte_for_byte(tmp_path, job_main, capsys, args, meta, indexed):
    """CLI and job give identical .info.json, split.yaml, index.sqlite, dataset config and .tar.idx files."""
    cli_root, job_root = _twins(tmp_path)
    res = CliRunner().invoke(cli, ["prepare", str(cli_root), "--non-interactive", "--no-progress", *ONE_PROCESS, *args])
    assert res.exit_code == 0, res.output
    capsys.readouterr()
    assert job_main([str(job_root), *args]) == 0
    out, err = capsys.readouterr()
    assert "Done." in out and "Indexing shards: 100%" in err and f"{len(indexed)}/{len(indexed)}" in err
    names = [".info.json", "index.sqlite", "index.uuid", "split.yaml", *meta]
    _assert_same_files(cli_root, job_root, [f".nv-meta/{n}" for n in names] + [f"{s}.idx" for s in indexed])


def test_job_tar_index_only_rebuilds_a_missing_index_like_the_cli(tmp_path, job_main):
    """--tar-index-only through Ray tasks rewrites the lost .tar.idx and index.sqlite identically."""
    cli_root, job_root = _twins(tmp_path)
    args = ["--split-ratio", "4,1,1", "--sample-type", "CaptioningSample", "--field-map", FIELD_MAP]
    assert CliRunner().invoke(cli, ["prepare", str(cli_root), "--non-interactive", "--no-progress", *ONE_PROCESS, *args]).exit_code == 0
    assert job_main([str(job_root), "--no-progress", *args]) == 0
    (job_root / "shards/shard_0002.tar.idx").unlink()
    assert job_main([str(job_root), "--no-progress", "--tar-index-only"]) == 0
    names = [".info.json", "index.sqlite", "index.uuid", "split.yaml", "dataset.yaml"]
    _assert_same_files(cli_root, job_root, [f".nv-meta/{n}" for n in names] + [f"{s}.idx" for s in SHARDS])


def test_a_relative_path_is_indexed_from_the_callers_directory(tmp_path, job_main, monkeypatch):
    """PATH relative to the job's directory: the shard tasks, whose Ray workers run in another directory
    (the session Ray's; a cluster's), index the same shards (they looked for 'job/shards/…' in theirs:
    FileNotFoundError), and the files are the CLI's."""
    cli_root, _ = _twins(tmp_path)
    args = ["--split-ratio", "4,1,1", "--sample-type", "CaptioningSample", "--field-map", FIELD_MAP]
    assert CliRunner().invoke(cli, ["prepare", str(cli_root), "--non-interactive", "--no-progress", *ONE_PROCESS, *args]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    assert job_main(["job", "--no-progress", *args]) == 0
    names = [".info.json", "index.sqlite", "index.uuid", "split.yaml", "dataset.yaml"]
    _assert_same_files(cli_root, tmp_path / "job", [f".nv-meta/{n}" for n in names] + [f"{s}.idx" for s in SHARDS])


def test_corrupt_shard_fails_with_the_shards_name_not_a_ray_traceback(tmp_path, job_main, capsys):
    """A shard with a garbage header gives exit code 1, 'Error: <shard>: invalid tar header…', no .nv-meta files."""
    _, root = _twins(tmp_path)
    shard = root / "shards/shard_0003.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:1536] + b"garbage".ljust(512, b"x") + data[2048:])
    assert job_main([str(root), "--split-ratio", "4,1,1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"Error: {shard}: invalid tar header at byte 1536; the shard is corrupt after that point\n"
    )
    assert list((root / ".nv-meta").iterdir()) == []


def test_already_prepared_dataset_needs_force_overwrite(tmp_path, job_main, capsys):
    """A second run without --force-overwrite is refused naming .info.json; with it, the dataset is re-prepared."""
    _, root = _twins(tmp_path)
    args = [str(root), "--split-ratio", "4,1,1", "--no-progress"]
    assert job_main(args) == 0
    capsys.readouterr()
    assert job_main(args) == 1
    assert capsys.readouterr().err == (
        f"Error: {root}/.nv-meta/.info.json exists: the dataset is already prepared; use --force-overwrite\n"
    )
    assert job_main([*args, "--force-overwrite"]) == 0


def test_the_datasets_checks_fail_before_ray_is_reached(tmp_path):
    """A folder without shards, an already prepared dataset: the job says so
    (exit 1, one 'Error:' line) before it connects to Ray; it started Ray first (seconds on a fresh
    machine). Shown with an --address nothing listens on: it is never contacted; with a good dataset
    it is, and the job fails naming it (it waited forever)."""
    import os
    import subprocess
    import sys

    _, ready = _twins(tmp_path)
    (ready / ".nv-meta").mkdir()
    (ready / ".nv-meta" / ".info.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    _, fresh = _twins(tmp_path / "fresh")
    cases = [
        ([str(tmp_path / "empty")], f"{tmp_path / 'empty'}: no .tar/.tgz shards found"),
        ([str(ready)], f"{ready}/.nv-meta/.info.json exists: the dataset is already prepared; use --force-overwrite"),
        # a good dataset: the address is tried, refused, and named (ray.init retried it without end)
        ([str(fresh)], "energon_ray: no Ray cluster at 127.0.0.1:1 (Connection refused): start one there"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for args, message in cases:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "prepare_job.py"), *args, "--split-ratio", "1,0,0", "--address", "127.0.0.1:1"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr[-2000:]
        assert proc.stderr.startswith(f"Error: {message}") and proc.stderr.count("\n") == 1, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split-parts", "train:.*", "--shuffle-tars"], "--shuffle-tars only applies to --split-ratio, not to --split-parts"),
        (["--tar-index-only", "--split-ratio", "8,1,1", "--exclude", "x"],
         "--tar-index-only only rebuilds the indexes of the shards in .nv-meta/.info.json; drop --split-ratio, --exclude"),
        (["--split-ratio", "0,0,0"], "argument --split-ratio: split_ratio entries must be >= 0 with a positive sum, got [0.0, 0.0, 0.0]"),
        (["--split-ratio", "8,1,1", "--sample-type", "CaptionSample"],
         "argument --sample-type: unknown sample type 'CaptionSample' (did you mean 'CaptioningSample'?); known: "),
    ],
)  # fmt: skip
def test_options_that_do_not_fit_are_usage_errors_naming_the_options_as_the_cli_does(tmp_path, job_main, capsys, args, message):
    """The CLI's option checks, with its flags' names (the job said "give exactly one of split_ratio (e.g.
    [8, 1, 1]) or split_parts", "drop ['split_ratio']", "unknown sample_type" after parsing): exit 2, nothing written."""
    with pytest.raises(SystemExit) as exited:
        job_main([str(tmp_path), *args])
    assert exited.value.code == 2
    assert f": error: {message}" in capsys.readouterr().err
    assert not (tmp_path / ".nv-meta").exists()


def test_split_parts_win_over_a_split_ratio_given_too_with_the_clis_warning(tmp_path, capsys):
    """As the CLI and Energon's prepare: the ratio is ignored (was exit 2, "not both")."""
    parse_args = runpy.run_path(str(ROOT / "jobs" / "prepare_job.py"), run_name="prepare_job")["parse_args"]
    args = parse_args([str(tmp_path), "--split-ratio", "8,1,1", "--split-parts", "train:.*"])
    assert (args.split_ratio, args.split_parts) == (None, [("train", ".*")])
    assert capsys.readouterr().err == (
        "Warning: --split-ratio 8,1,1 is ignored: --split-parts decides the split parts (as in Energon's prepare)\n")


@pytest.mark.parametrize(
    "value, said",
    [
        ("-1,1,1", "split_ratio entries must be >= 0 with a positive sum, got [-1.0, 1.0, 1.0]"),
        ("-0.5,1,1", "split_ratio entries must be >= 0 with a positive sum, got [-0.5, 1.0, 1.0]"),
        ("1,-1,1", "split_ratio entries must be >= 0 with a positive sum, got [1.0, -1.0, 1.0]"),
        ("0,0,0", "split_ratio entries must be >= 0 with a positive sum, got [0.0, 0.0, 0.0]"),
        ("a,b", "expected numbers like '8,1,1' or '0.8,0.1,0.1', got 'a,b'"),
        ("1,1", "split_ratio must have 3 entries (train, val, test), got [1.0, 1.0]"),
    ],
)
def test_a_bad_split_ratio_is_one_line_naming_the_option_and_the_value(tmp_path, job_main, capsys, value, said):
    """Each bad --split-ratio is one usage-error line naming the option and the value, a negative first
    entry too (argparse took "-1,1,1" for an option and said only "expected one argument")."""
    from tests.helpers import usage_error

    assert usage_error(capsys, job_main, [str(tmp_path), "--split-ratio", value]) == f"argument --split-ratio: {said}"
    assert not (tmp_path / ".nv-meta").exists()


def test_an_exclude_pattern_may_start_with_a_minus():
    """``--exclude -tmp`` is the regex ``-tmp`` (argparse said "expected one argument"), repeatable;
    an option after ``--exclude`` stays an option."""
    parse_args = runpy.run_path(str(ROOT / "jobs" / "prepare_job.py"), run_name="prepare_job")["parse_args"]
    args = parse_args([str(ROOT), "--split-ratio", "8,1,1", "--exclude", "-tmp", "--exclude", "x", "--shuffle-tars"])
    assert args.exclude == ["-tmp", "x"] and args.shuffle_tars is True
