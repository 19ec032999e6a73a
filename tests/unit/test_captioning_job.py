"""``jobs/captioning_job.py``: a bad option or config stops it with a usage error (exit 2) naming the
file, the key and the value, before Ray starts (this tier forbids ``ray.init``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_job, usage_error
import yaml

ROOT = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((ROOT / "jobs" / "captioning.yaml").read_text())


def _job():
    return load_job("captioning_job")


_usage_error = usage_error


def _config(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_shipped_captioning_config_passes_its_checks():
    """jobs/captioning.yaml, the default config, has every key the job knows and no other."""
    args, cfg = _job().parse_args([])
    assert cfg == GOOD and args.max_batches is None


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "{dir}/nofile.yaml: cannot read the config: No such file or directory"),
        ("", "{dir}/job.yaml: expected a mapping of workdir, dataset, loader, task, got an empty file"),
        ("workdir: w\ndataset:\n  samples_per_shard: [10\nloader: {\n", "{dir}/job.yaml, line 4, column 7: not valid YAML: while parsing a flow sequence"),
        (yaml.safe_dump({k: v for k, v in GOOD.items() if k != "task"}), "{dir}/job.yaml: section task (with image_size, max_length) is missing"),
        (yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "batch_sise": 2}}), "{dir}/job.yaml: unknown key loader.batch_sise (did you mean 'batch_size'?)"),
        (yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "num_wrokers": 9}}), "{dir}/job.yaml: unknown key loader.num_wrokers (did you mean 'num_workers'?)"),
        (yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "batch_size": "abc"}}), "{dir}/job.yaml: loader.batch_size must be an integer >= 1, got 'abc'"),
        (yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "max_batches": 0}}), "{dir}/job.yaml: loader.max_batches must be an integer >= 1 or null, got 0"),
    ],
)
def test_captioning_job_refuses_a_bad_config_naming_file_key_and_value(tmp_path, capsys, content, expected):
    """A missing, malformed, empty or incomplete config, a misspelt key or a bad value: usage error naming them."""
    path = str(tmp_path / "nofile.yaml") if content is None else _config(tmp_path, content)
    message = _usage_error(capsys, _job().parse_args, ["--config", path])
    assert message.startswith(expected.format(dir=tmp_path)), message


@pytest.mark.parametrize("value", ["0", "-2"])
def test_captioning_job_refuses_max_batches_below_one(capsys, value):
    """``--max-batches 0`` (it ran the whole epoch) and ``-2`` (it ran one batch) are usage errors."""
    message = _usage_error(capsys, _job().parse_args, ["--max-batches", value])
    assert message == f"argument --max-batches: expected an integer >= 1, got {value}"


def test_an_endless_loader_without_a_batch_limit_is_a_usage_error(tmp_path, capsys):
    """loader.repeat: true with max_batches: null and no --max-batches ran without end (the progress bar
    at 100% and counting); a usage error names the config, both keys and the option. A limit from
    either place is fine."""
    path = _config(tmp_path, yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "repeat": True}}))
    message = _usage_error(capsys, _job().parse_args, ["--config", path])
    assert message == f"{path}: loader.repeat is true and loader.max_batches is null: the job would never end; set loader.max_batches or pass --max-batches N"
    assert _job().parse_args(["--config", path, "--max-batches", "3"])[1]["loader"]["repeat"] is True
    limited = _config(tmp_path, yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "repeat": True, "max_batches": 3}}), "limited.yaml")
    assert _job().parse_args(["--config", limited])[1]["loader"]["max_batches"] == 3


def test_captioning_job_with_a_bad_config_exits_2_without_a_traceback_or_ray(tmp_path):
    """Run as a script (as ``ray job submit`` does): exit 2, the file and the key on stderr, no traceback, no Ray."""
    path = _config(tmp_path, yaml.safe_dump({**GOOD, "loader": {**GOOD["loader"], "batch_sise": 2}}), "extra.yaml")
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "captioning_job.py"), "--config", path],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert f"error: {path}: unknown key loader.batch_sise (did you mean 'batch_size'?)" in done.stderr
    assert "Traceback" not in done.stderr and "Ray" not in done.stdout + done.stderr


def test_captioning_job_refuses_a_workdir_dataset_of_another_config(tmp_path, capsys):
    """The workdir's dataset was generated with 8 samples of 32x24, the config asks for 1200 of 320x240:
    the job exits naming the folder and both values (it ran on the old 8 samples silently), before Ray."""
    from energon_ray.tasks.run import synthetic_captioning

    synthetic_captioning(tmp_path / "dataset", 8, 100, image_size=(32, 24))
    path = _config(tmp_path, yaml.safe_dump({**GOOD, "workdir": str(tmp_path)}))
    with pytest.raises(SystemExit) as caught:
        _job().main(["--config", path])
    assert str(caught.value.code).startswith(
        f"captioning_job: {tmp_path / 'dataset'}: holds a synthetic dataset written with other parameters "
        "(image_size was [32, 24], is now [320, 240]; num_samples was 8, is now 1200)"
    )


def _small(tmp_path: Path, **loader) -> str:
    dataset = {"num_samples": 8, "samples_per_shard": 4, "image_size": [32, 24]}
    return _config(tmp_path, yaml.safe_dump({**GOOD, "workdir": str(tmp_path), "dataset": dataset,
                                             "loader": {**GOOD["loader"], **loader}}))  # fmt: skip


def test_captioning_job_with_an_unknown_split_part_exits_naming_the_config_and_the_part(tmp_path, capsys):
    """loader.split_part 'trian' (a typo) stopped the job with a DatasetConfigError traceback; now one
    line names the config file, the value and the dataset's parts (exit status 1), before Ray."""
    path = _small(tmp_path, split_part="trian")
    with pytest.raises(SystemExit) as caught:
        _job().main(["--config", path])
    message = str(caught.value.code)
    assert message.startswith(f"captioning_job: {path}: the loader section does not fit the dataset: ")
    assert "unknown split part 'trian'" in message and "'train'" in message and "\n" not in message


def test_captioning_job_with_a_workdir_that_is_a_file_exits_naming_it(tmp_path):
    """--workdir naming a file stopped the job with a NotADirectoryError traceback; now exit 1 with one line."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SystemExit) as caught:
        _job().main(["--config", _small(tmp_path), "--workdir", str(afile)])
    assert str(caught.value.code).startswith(f"captioning_job: --workdir {afile}: cannot write the dataset there: ")
