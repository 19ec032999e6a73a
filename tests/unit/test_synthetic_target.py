"""A synthetic dataset is written only into a new or empty folder (or over an unfinished write of its
own); a prepared folder is used as is and any other folder is refused, its files left byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from energon_ray.errors import DatasetConfigError
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import SYNTHETIC_MARKER, synthetic_target, write_captioning_dataset, write_synthetic_dataset

CAPTIONING = dict(split_ratio=(1, 0, 0), sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"}, progress=False)


def _files(root: Path) -> Dict[str, bytes]:
    """Every file under ``root`` (by relative path) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _writer(calls: List[Path], num_samples: int = 4):
    """A ``write`` for write_synthetic_dataset that records the folders it was called with."""

    def write(folder: Path) -> None:
        calls.append(folder)
        write_captioning_dataset(folder, num_samples, 2, image_size=(8, 8))

    return write


def _prepared(root: Path) -> Path:
    """A captioning dataset prepared by hand (as a user would), not by write_synthetic_dataset."""
    write_captioning_dataset(root, 4, 2, image_size=(8, 8))
    prepare_dataset(root, **CAPTIONING)
    return root


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["new", "empty"])
def test_new_or_empty_folder_is_written_and_prepared(tmp_path, make):
    """A missing or empty folder gets the shards and .nv-meta, and no marker is left behind."""
    root = tmp_path / "data"
    make(root)
    calls: List[Path] = []
    assert write_synthetic_dataset(root, _writer(calls), **CAPTIONING) == root
    assert calls == [root] and (root / ".nv-meta" / ".info.json").is_file()
    assert not (root / SYNTHETIC_MARKER).exists() and synthetic_target(root) == "prepared"


@pytest.mark.parametrize("legacy", [False, True], ids=["info_json", "legacy_info_yaml"])
def test_prepared_folder_is_used_as_is(tmp_path, legacy):
    """A folder prepared by energon_ray (.info.json) or by Energon (.info.yaml only): no write, no prepare."""
    root = _prepared(tmp_path / "data")
    if legacy:
        info = root / ".nv-meta" / ".info.json"
        (root / ".nv-meta" / ".info.yaml").write_text(yaml.safe_dump(json.loads(info.read_text())))
        info.unlink()
    before = _files(root)
    calls: List[Path] = []
    assert write_synthetic_dataset(root, _writer(calls, num_samples=6), **CAPTIONING) == root
    assert calls == [] and _files(root) == before


@pytest.mark.parametrize("entries", [["shards/shard_0000.tar", "notes.txt"], [".nv-meta/split.yaml"]], ids=["shards", "bare_nv_meta"])
def test_folder_of_other_files_is_refused_untouched(tmp_path, entries):
    """A non-empty, unprepared folder: DatasetConfigError naming it, its entries and dataset.prepare=null; nothing written."""
    root = tmp_path / "mine"
    for i, name in enumerate(entries):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(f"user file {i}".encode())
    before = _files(root)
    calls: List[Path] = []
    with pytest.raises(DatasetConfigError) as raised:
        write_synthetic_dataset(root, _writer(calls), **CAPTIONING)
    message = str(raised.value)
    assert str(root) in message and "dataset.prepare=null" in message
    assert all(name.split("/")[0] in message for name in entries)
    assert calls == [] and _files(root) == before


def test_file_instead_of_folder_is_refused(tmp_path):
    """A path that is a file is refused by name and left as it was."""
    root = tmp_path / "data"
    root.write_bytes(b"mine")
    with pytest.raises(DatasetConfigError, match=rf"{root}: not a folder"):
        write_synthetic_dataset(root, _writer([]), **CAPTIONING)
    assert root.read_bytes() == b"mine"


def test_write_interrupted_before_prepare_is_redone(tmp_path):
    """A write that died half way leaves the marker (no .nv-meta); the next call writes and prepares it all."""
    root = tmp_path / "data"

    def dies(folder: Path) -> None:
        write_captioning_dataset(folder, 2, 2, image_size=(8, 8))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_synthetic_dataset(root, dies, **CAPTIONING)
    assert (root / SYNTHETIC_MARKER).is_file() and synthetic_target(root) == "redo"
    write_synthetic_dataset(root, _writer([]), **CAPTIONING)
    info = json.loads((root / ".nv-meta" / ".info.json").read_text())
    assert sum(info["shard_counts"].values()) == 4 and not (root / SYNTHETIC_MARKER).exists()


def test_prepare_interrupted_after_info_json_is_redone(tmp_path):
    """Marker and .info.json but no split.yaml (prepare died): prepared again, over its own .info.json."""
    root = tmp_path / "data"
    write_synthetic_dataset(root, _writer([]), **CAPTIONING)
    (root / ".nv-meta" / "split.yaml").unlink()
    (root / SYNTHETIC_MARKER).write_text("unfinished\n")
    calls: List[Path] = []
    write_synthetic_dataset(root, _writer(calls), **CAPTIONING)
    assert calls == [root] and (root / ".nv-meta" / "split.yaml").is_file() and not (root / SYNTHETIC_MARKER).exists()


def test_captioning_task_writer_refuses_a_users_shards(tmp_path):
    """The captioning config's prepare step on a folder holding the user's shard_0000.tar raises; the tar keeps its bytes."""
    from energon_ray.tasks.vision.captioning.data import synthetic

    root = tmp_path / "userraw"
    (root / "shards").mkdir(parents=True)
    write_captioning_dataset(tmp_path / "theirs", 3, 3, image_size=(8, 8), seed=7)
    (root / "shards" / "shard_0000.tar").write_bytes((tmp_path / "theirs" / "shards" / "shard_0000.tar").read_bytes())
    before = _files(root)
    with pytest.raises(DatasetConfigError, match=rf"{root}: holds shards/ .*dataset\.prepare=null"):
        synthetic(root, num_samples=4, samples_per_shard=2, image_size=(8, 8))
    assert _files(root) == before


def test_synthetic_dataset_asked_for_with_other_parameters_is_refused(tmp_path):
    """A synthetic dataset of 4 samples asked for again with 6 (a changed ``dataset.prepare.num_samples``)
    raises, naming the folder and what changed; the same recipe again is used as is; nothing rewritten."""
    from energon_ray.tasks.vision.captioning.data import synthetic

    root = synthetic(tmp_path / "captions", num_samples=4, samples_per_shard=2, image_size=(8, 8), split_ratio=(1, 0, 0))
    before = _files(root)
    assert synthetic(root, num_samples=4, samples_per_shard=2, image_size=(8, 8), split_ratio=(1, 0, 0)) == root
    with pytest.raises(DatasetConfigError) as raised:
        synthetic(root, num_samples=6, samples_per_shard=2, image_size=(8, 8), split_ratio=(4, 1, 1))
    message = str(raised.value)
    assert message.startswith(f"{root}: holds a synthetic dataset written with other parameters (")
    assert "num_samples was 4, is now 6; split_ratio was [1, 0, 0], is now [4, 1, 1])" in message
    assert "delete the folder to write it again" in message and _files(root) == before
