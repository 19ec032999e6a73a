"""The jobs' option and config checks (``energon_ray.tasks.job_args``): each problem names the file, the key and the value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from energon_ray.tasks.job_args import (
    JobConfigError, boolean, optional, positive, positive_int, positive_pair, read_config, text,
)  # fmt: skip

SCHEMA = {"workdir": text, "loader": {"batch_size": positive, "repeat": boolean, "max_batches": optional(positive)},
          "dataset": {"image_size": positive_pair}}  # fmt: skip
GOOD = {"workdir": "runs", "loader": {"batch_size": 4, "repeat": False, "max_batches": None}, "dataset": {"image_size": [64, 48]}}


def _write(tmp_path: Path, text_: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text_)
    return path


def _error(path: Path) -> str:
    with pytest.raises(JobConfigError) as caught:
        read_config(path, SCHEMA)
    return str(caught.value)


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5"])
def test_positive_int_refuses_counts_below_one_and_non_integers(value):
    """``positive_int`` is argparse's type for counts: 0, negatives and non-integers are refused with the value."""
    with pytest.raises(argparse.ArgumentTypeError, match=rf"expected an integer >= 1, got '?{value}'?"):
        positive_int(value)
    assert positive_int("7") == 7


def test_a_good_config_comes_back_as_read(tmp_path):
    """A config with every key, none other, each value fine, is returned as the YAML mapping."""
    assert read_config(_write(tmp_path, yaml.safe_dump(GOOD)), SCHEMA) == GOOD


def test_a_missing_file_names_the_file(tmp_path):
    """A config that does not exist: the path and the OS's reason, no traceback of open()."""
    assert _error(tmp_path / "nofile.yaml") == f"{tmp_path / 'nofile.yaml'}: cannot read the config: No such file or directory"


def test_malformed_yaml_names_the_file_line_and_column(tmp_path):
    """Malformed YAML: the file (not PyYAML's "<unicode string>"), the line and column, and what the parser expected."""
    message = _error(_write(tmp_path, "workdir: w\nloader:\n  batch_size: [10\ndataset: {\n", "bad.yaml"))
    assert message.startswith(f"{tmp_path / 'bad.yaml'}, line 4, column 8: not valid YAML: while parsing a flow sequence (from line 3")
    assert "unicode string" not in message


@pytest.mark.parametrize("content, got", [("", "an empty file"), ("# only a comment\n", "an empty file"), ("- 1\n", "[1]")])
def test_an_empty_file_or_a_list_asks_for_the_sections(tmp_path, content, got):
    """A config that is not a mapping: the file, the sections it must have, and what it holds."""
    path = _write(tmp_path, content)
    assert _error(path) == f"{path}: expected a mapping of workdir, loader, dataset, got {got}"


def test_a_missing_section_is_named_with_its_keys(tmp_path):
    """A config without a section: the section and the keys it must hold."""
    path = _write(tmp_path, yaml.safe_dump({k: v for k, v in GOOD.items() if k != "loader"}))
    assert _error(path) == f"{path}: section loader (with batch_size, repeat, max_batches) is missing"


def test_misspelt_keys_are_refused_with_the_close_match(tmp_path):
    """Every unknown key of a section is named with the closest known key and the section's keys, one a line."""
    loader = {**GOOD["loader"], "batch_sise": 2, "zzz": 1}
    path = _write(tmp_path, yaml.safe_dump({**GOOD, "loader": loader}))
    assert _error(path).splitlines() == [
        f"{path}: unknown key loader.batch_sise (did you mean 'batch_size'?); the known keys of loader are batch_size, repeat, max_batches",
        f"{path}: unknown key loader.zzz; the known keys of loader are batch_size, repeat, max_batches",
    ]


def test_an_unknown_section_and_a_missing_key_are_named(tmp_path):
    """An unknown top-level key (with its close match) and a key missing from a section."""
    path = _write(tmp_path, yaml.safe_dump({**GOOD, "loadr": {}, "dataset": {}}))
    assert _error(path).splitlines() == [
        f"{path}: unknown key loadr (did you mean 'loader'?); the known keys are workdir, loader, dataset",
        f"{path}: dataset.image_size is missing",
    ]


@pytest.mark.parametrize(
    "section, key, value, want",
    [
        ("loader", "batch_size", "abc", "an integer >= 1"),
        ("loader", "batch_size", 0, "an integer >= 1"),
        ("loader", "batch_size", True, "an integer >= 1"),
        ("loader", "max_batches", -2, "an integer >= 1 or null"),
        ("loader", "repeat", "no", "true or false"),
        ("dataset", "image_size", [64], "two integers >= 1, like [320, 240]"),
    ],
)
def test_a_bad_value_names_the_key_what_it_must_be_and_the_value(tmp_path, section, key, value, want):
    """A value that fails its check: ``<section>.<key> must be <what>, got <value>``."""
    path = _write(tmp_path, yaml.safe_dump({**GOOD, section: {**GOOD[section], key: value}}))
    assert _error(path) == f"{path}: {section}.{key} must be {want}, got {value!r}"


def test_a_scalar_where_a_section_belongs_is_named(tmp_path):
    """A section given as a scalar: the section, the keys it must map, and the value."""
    path = _write(tmp_path, yaml.safe_dump({**GOOD, "dataset": 5}))
    assert _error(path) == f"{path}: section dataset must be a mapping of image_size, got 5"


def test_a_key_given_twice_is_refused_naming_the_file_line_and_key(tmp_path):
    """PyYAML kept the last of two ``batch_size`` lines silently, so the first one the user saw was ignored."""
    path = _write(tmp_path, "workdir: runs\nloader:\n  batch_size: 4\n  repeat: false\n  max_batches: null\n"
                            "  batch_size: 64\ndataset: {image_size: [64, 48]}\n")  # fmt: skip
    message = _error(path)
    assert message.startswith(f"{path}, line 6, column 3: not valid YAML: ") and "key 'batch_size' appears twice" in message
