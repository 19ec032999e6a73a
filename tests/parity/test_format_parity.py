"""On-disk format parity: datasets prepared by energon_ray load in megatron-energon and vice versa,
and both preparers write the same indexes and equivalent metadata for the same tars."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tarfile
from pathlib import Path

import braceexpand
import pytest
import torch
import yaml
from click.testing import CliRunner

import energon_ray as er
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.prepare import prepare_dataset
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import ShardReader, parse_sample
from energon_ray.synthetic import add_member, captioning_samples, encode_image, sample_image, write_shards
from tests.helpers import prepared

energon = pytest.importorskip("megatron.energon")
pytestmark = pytest.mark.parity

FIELD_MAP = {"image": "jpg", "caption": "txt"}
CAPTIONING_ARGS = ["--sample-type", "CaptioningSample", "--field-map", json.dumps(FIELD_MAP)]


def write_plain(root: Path, num: int = 10, per_shard: int = 2) -> dict:
    """Captioning shards under ``root/shards``; returns ``{key: parts}``."""
    samples = captioning_samples(num, image_size=(8, 6))
    write_shards(root / "shards", samples, per_shard)
    return dict(samples)


def write_tricky(root: Path) -> None:
    """Plain shards plus: a PAX tar with a directory entry, meta and extension-less members, keys with
    folders, dotted part names and a name long enough to need an extended header; tars at the root,
    in ``a/b`` and ``a-b`` (order by path components), an uncompressed ``.tgz``, hidden tars."""
    write_plain(root)
    for folder, prefix, start in (("", "top", 50), ("a/b", "s", 60), ("a-b", "s", 70), (".hidden", "s", 80),
                                  ("shards", ".dot", 90)):  # fmt: skip
        write_shards(root / folder, captioning_samples(2, image_size=(8, 6), start=start), 2, prefix=prefix)
    write_shards(root / "t", captioning_samples(2, image_size=(8, 6), start=95), 2)
    (root / "t/shard_0000.tar").rename(root / "t/shard_0000.tgz")
    (root / "extra").mkdir()
    long_key = "deep/" + "x" * 120
    with tarfile.open(root / "extra/odd.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo("deep")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        add_member(tar, "__meta__/info.json", b"{}", mtime=0)  # skipped: meta member
        add_member(tar, "README", b"no part", mtime=0)  # skipped: no extension
        add_member(tar, "__meta__.json", b"{}", mtime=0)  # a sample with key __meta__ (no skip)
        for key in ("deep/k1", "deep/k2", long_key):
            add_member(tar, f"{key}.txt", key.encode(), mtime=0)
            add_member(tar, f"{key}.seg.detail.json", b"[1, 2]", mtime=0)


def energon_prepare(root: Path, *args: str) -> None:
    """megatron-energon's own ``energon prepare`` (its click command, in-process)."""
    from megatron.energon.cli.main import main as energon_main

    cmd = ["prepare", str(root), "--non-interactive", "--no-progress", "--num-workers", "1", *args]
    res = CliRunner().invoke(energon_main, cmd, catch_exceptions=False)
    assert res.exit_code == 0, res.output


def ours_prepare(root: Path, *args: str) -> None:
    from energon_ray.cli.main import main

    cmd = ["prepare", str(root), "--non-interactive", "--no-progress", *args]
    res = CliRunner().invoke(main, cmd, catch_exceptions=False)
    assert res.exit_code == 0, res.output


def energon_iter(root: Path, split_part: str) -> list:
    """``(key, caption)`` of every sample megatron-energon loads from a split part, in order."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(root, split_part=split_part, worker_config=wc, batch_size=None)
    return [(s.__key__, s.caption) for s in get_loader(ds)]


def ray_read(root: Path, split_part: str) -> list:
    """``(key, parts)`` of every sample energon_ray's reader returns from a split part, in order."""
    ds = PreparedDataset.open(root, split_part)
    out = []
    for shard in ds.shards:
        reader = ShardReader(shard.path, shard.name, read_tar_index(shard.path))
        try:
            out += [parse_sample(data, shard.name, i)[:2] for i, data in reader.read_run(0, shard.count - 1)]
        finally:
            reader.close()
    return out


def expanded_splits(root: Path) -> dict:
    data = yaml.safe_load((root / ".nv-meta/split.yaml").read_text())
    parts = {k: [n for p in v for n in braceexpand.braceexpand(p)] for k, v in data["split_parts"].items()}
    return {"split_parts": parts, "exclude": data.get("exclude", [])}


def sqlite_rows(root: Path) -> tuple:
    db = sqlite3.connect(root / ".nv-meta/index.sqlite")
    samples = db.execute("SELECT * FROM samples ORDER BY tar_file_id, sample_index").fetchall()
    parts = db.execute("SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset").fetchall()
    schema = db.execute("SELECT type, name, tbl_name FROM sqlite_master ORDER BY name").fetchall()
    return samples, parts, schema


def test_megatron_energon_loads_every_split_of_a_dataset_prepared_by_energon_ray(tmp_path):
    written = write_plain(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[3, 1, 1], sample_type="CaptioningSample", field_map=FIELD_MAP,
                    progress=False)  # fmt: skip
    loaded = {part: energon_iter(tmp_path, part) for part in ("train", "val", "test")}
    assert [len(v) for v in loaded.values()] == [6, 2, 2]
    all_keys = [key for part in loaded.values() for key, _ in part]
    assert all_keys == sorted(written)  # unshuffled shards, in split order
    for part in loaded.values():
        for key, caption in part:
            assert caption == written[key]["txt"].decode()


def test_energon_ray_reads_every_sample_of_a_dataset_prepared_by_megatron_energon(tmp_path):
    written = write_plain(tmp_path)
    energon_prepare(tmp_path, "--split-ratio", "3,1,1", *CAPTIONING_ARGS)
    read = [sample for part in ("train", "val", "test") for sample in ray_read(tmp_path, part)]
    assert [key for key, _ in read] == sorted(written)
    assert all(parts == written[key] for key, parts in read)


@pytest.mark.parametrize(
    "args",
    [
        ["--split-ratio", "8,1,1"],
        ["--split-ratio", "6,2,2", "--shuffle-tars"],
        ["--split-ratio", "1,1,1", "--exclude", "shard_000[13]"],
        ["--split-parts", "train:shards/shard_000[0-2].tar", "--split-parts", "val:extra/.*"],
    ],
    ids=["ratio", "shuffle", "exclude", "split-parts"],
)
def test_both_preparers_write_identical_indexes_and_equivalent_metadata(tmp_path, args):
    write_tricky(tmp_path / "theirs")
    shutil.copytree(tmp_path / "theirs", tmp_path / "ours")
    energon_prepare(tmp_path / "theirs", *args, *CAPTIONING_ARGS)
    ours_prepare(tmp_path / "ours", *args, *CAPTIONING_ARGS)
    theirs_idx = sorted(p.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs").rglob("*.tar.idx"))
    assert theirs_idx == sorted(p.relative_to(tmp_path / "ours") for p in (tmp_path / "ours").rglob("*.tar.idx"))
    for rel in theirs_idx:
        assert (tmp_path / "theirs" / rel).read_bytes() == (tmp_path / "ours" / rel).read_bytes(), rel
    info = [json.loads((tmp_path / d / ".nv-meta/.info.json").read_text()) for d in ("theirs", "ours")]
    assert list(info[0]["shard_counts"].items()) == list(info[1]["shard_counts"].items())
    assert info[1]["energon_version"].split("+")[0] == info[0]["energon_version"]
    assert expanded_splits(tmp_path / "theirs") == expanded_splits(tmp_path / "ours")
    for name in ("split.yaml", "dataset.yaml"):  # also textually equal: same brace-collapsing
        texts = [yaml.safe_load((tmp_path / d / ".nv-meta" / name).read_text()) for d in ("theirs", "ours")]
        assert texts[0] == texts[1], name
    assert sqlite_rows(tmp_path / "theirs") == sqlite_rows(tmp_path / "ours")


def test_both_preparers_brace_collapse_split_yaml_alike_when_a_folder_number_counts_up(tmp_path):
    for name in ("theirs", "ours"):
        shards = ("part_0/shard_5.tar", "part_1/shard_5.tar", "part_2/shard_5.tar", "part_2/shard_6.tar", "shard_9.tar",
                  "shard_10.tar")  # fmt: skip
        for i, shard in enumerate(shards):
            path = tmp_path / name / shard
            write_shards(path.parent, captioning_samples(1, image_size=(4, 4), start=i), 1)
            (path.parent / "shard_0000.tar").rename(path)
    energon_prepare(tmp_path / "theirs", "--split-ratio", "1,0,0")
    ours_prepare(tmp_path / "ours", "--split-ratio", "1,0,0")
    texts = [(tmp_path / d / ".nv-meta/split.yaml").read_text() for d in ("theirs", "ours")]
    assert "part_{0..2}/shard_5.tar" in texts[0]
    assert texts[0] == texts[1]


def test_known_divergence_energon_drops_the_last_shard_when_the_ratio_sum_rounds_below_one(tmp_path):
    """Energon accumulates normalized float ratios; where the total rounds below one (0.1,0.2,0.3 on
    Python < 3.12, whose float sum() is not compensated) it loses the last shard. We never do."""
    for name in ("theirs", "ours"):
        write_shards(tmp_path / name / "shards", captioning_samples(10, image_size=(4, 4)), 1)
    energon_prepare(tmp_path / "theirs", "--split-ratio", "0.1,0.2,0.3")
    ours_prepare(tmp_path / "ours", "--split-ratio", "0.1,0.2,0.3")
    theirs, ours = expanded_splits(tmp_path / "theirs"), expanded_splits(tmp_path / "ours")
    ratios = [0.1, 0.2, 0.3]
    total, reached = sum(ratios), 0.0
    for ratio in ratios:
        reached += ratio / total
    lost = [] if int(10 * reached) == 10 else ["shards/shard_0009.tar"]
    assert ours["split_parts"]["test"][-1] == "shards/shard_0009.tar"
    assert theirs["split_parts"]["test"] + lost == ours["split_parts"]["test"]
    assert theirs["split_parts"]["train"] == ours["split_parts"]["train"]
    assert theirs["split_parts"]["val"] == ours["split_parts"]["val"]


def test_an_uncompressed_tgz_shard_loads_in_both_libraries(tmp_path):
    written = write_plain(tmp_path, num=4)
    (tmp_path / "shards/shard_0001.tar").rename(tmp_path / "shards/shard_0001.tgz")
    prepare_dataset(tmp_path, split_ratio=[1, 0, 0], sample_type="CaptioningSample", field_map=FIELD_MAP,
                    progress=False)  # fmt: skip
    assert [key for key, _ in energon_iter(tmp_path, "train")] == sorted(written)
    assert [key for key, _ in ray_read(tmp_path, "train")] == sorted(written)


def test_energon_ray_reads_a_tgz_shard_whose_index_megatron_energon_wrote_as_x_tar_idx(tmp_path):
    written = write_plain(tmp_path, num=4)
    (tmp_path / "shards/shard_0001.tar").rename(tmp_path / "shards/shard_0001.tgz")
    energon_prepare(tmp_path, "--split-ratio", "1,0,0", *CAPTIONING_ARGS)
    assert (tmp_path / "shards/shard_0001.tar.idx").is_file()  # Energon's name for the .tgz's index
    assert not (tmp_path / "shards/shard_0001.tgz.idx").exists()
    read = ray_read(tmp_path, "train")
    assert [key for key, _ in read] == sorted(written)
    assert all(parts == written[key] for key, parts in read)
    PreparedDataset.open(tmp_path, "train")  # checks every index against its tar and .info.json


def test_tar_index_only_on_a_legacy_info_yaml_dataset_adds_the_same_info_json_as_energon(tmp_path):
    write_plain(tmp_path / "theirs", num=4)
    energon_prepare(tmp_path / "theirs", "--split-ratio", "1,0,0")
    meta = tmp_path / "theirs/.nv-meta"
    (meta / ".info.yaml").write_text(yaml.safe_dump(json.loads((meta / ".info.json").read_text())))
    (meta / ".info.json").unlink()
    shutil.copytree(tmp_path / "theirs", tmp_path / "ours")
    energon_prepare(tmp_path / "theirs", "--tar-index-only")
    ours_prepare(tmp_path / "ours", "--tar-index-only")
    theirs = (tmp_path / "theirs/.nv-meta/.info.json").read_bytes()
    assert (tmp_path / "ours/.nv-meta/.info.json").read_bytes() == theirs
    assert (tmp_path / "ours/.nv-meta/.info.yaml").read_bytes() == (meta / ".info.yaml").read_bytes()


def test_both_clis_refuse_a_non_interactive_rerun_with_exit_code_1(tmp_path):
    from megatron.energon.cli.main import main as energon_main

    from energon_ray.cli.main import main as ours_main

    write_plain(tmp_path, num=4)
    ours_prepare(tmp_path, "--split-ratio", "8,1,1")
    for cli in (energon_main, ours_main):
        res = CliRunner().invoke(cli, ["prepare", str(tmp_path), "--non-interactive", "--split-ratio", "8,1,1"])
        assert res.exit_code == 1 and "already" in res.output, (cli.name, res.output)


def test_both_libraries_refuse_to_load_an_empty_split_part(tmp_path):
    write_plain(tmp_path, num=6, per_shard=2)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], sample_type="CaptioningSample", field_map=FIELD_MAP,
                    progress=False)  # fmt: skip
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

    with pytest.raises(EmptyDatasetError):
        energon_iter(tmp_path, "val")
    with pytest.raises(ValueError, match="'val' has no shards"):
        PreparedDataset.open(tmp_path, "val")


def test_a_dataset_file_store_reads_and_names_files_as_energons_webdataset_file_store(tmp_path):
    """DatasetFileStore gives the bytes and SourceInfo (index: the file's name) of Energon's WebdatasetFileStore."""
    from megatron.energon.cache.file_store import WebdatasetFileStore
    from megatron.energon.epathlib import EPath

    from energon_ray.cache.stores import DatasetFileStore

    write_plain(tmp_path, num=6, per_shard=2)
    prepare_dataset(tmp_path, split_ratio=(1, 0, 0), sample_type="CaptioningSample", field_map=FIELD_MAP, progress=False)
    ours, theirs = DatasetFileStore(tmp_path), WebdatasetFileStore(EPath(tmp_path))
    for name in ("sample_000003.txt", "sample_000004.jpg"):
        (data, info), (their_data, their_info) = ours[name], theirs[name]
        assert (data, info.index, info.shard_name, info.file_names) == (
            their_data, their_info.index, their_info.shard_name, their_info.file_names
        ) and info.index == name
        assert info.dataset_path == str(their_info.dataset_path)


def test_guess_content_images_stored_as_pickles_load_as_energons_trusted_or_not(tmp_path):
    """guess_content=True on a dataset whose images are stored as .pkl parts: their bytes are images,
    so they decode as Energon's without the opt-in too (nothing is unpickled; a real pickle part is
    still refused, see test_sample_decoder), and with it."""
    samples = [(f"s{i:03d}", {"pkl": encode_image(sample_image(i, (8, 6)), "PNG")}) for i in range(4)]
    path = prepared(tmp_path / "ds", samples, 2, sample_type="ImageSample", field_map={"image": "pkl"})

    class Ours(er.DefaultTaskEncoder):
        decoder = er.SampleDecoder(guess_content=True)

    class Theirs(energon.DefaultTaskEncoder):
        decoder = energon.SampleDecoder(guess_content=True)

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    their_wc = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    theirs = energon.get_loader(energon.get_val_dataset(path, split_part="train", batch_size=1, worker_config=their_wc, task_encoder=Theirs()))
    expected = {b.__key__[0]: b.image[0] for b in theirs}
    for trusted in (False, True):
        ours = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=1, worker_config=wc, task_encoder=Ours(),
                                                trust_dataset_code=trusted))  # fmt: skip
        got = {b.__key__[0]: b.image[0] for b in ours}
        assert sorted(got) == sorted(expected) == [f"s{i:03d}" for i in range(4)]
        assert all(got[k].shape == (3, 6, 8) and torch.equal(got[k], expected[k]) for k in expected)
