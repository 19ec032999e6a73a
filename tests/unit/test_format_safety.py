"""Issue 12, format layer: prepare never writes outside the dataset, a bad index or a bad name is a clear error."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_ray.errors import DatasetConfigError, ShardReadError
from energon_ray.format import energon_yaml
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.indexer import index_dataset
from energon_ray.format.info import read_info
from energon_ray.format.prepare import prepare_dataset
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import ShardReader, parse_sample
from energon_ray.plan.stream import SegmentSpec
from energon_ray.source.reader import ReadSegment, shard_table
from energon_ray.synthetic import add_member, text_samples, write_shards

TEXT = dict(sample_type="TextSample", field_map={"text": "txt"}, progress=False)
#: ``000001`` with its first two bytes replaced by ones that are not UTF-8, as tarfile decodes the name.
BAD_KEY = b"\xff\xfe0001".decode("utf-8", "surrogateescape")


def text_shards(root: Path, num: int = 6, per_shard: int = 3) -> None:
    write_shards(root / "shards", text_samples(num), per_shard)


def prepared_text(root: Path) -> Path:
    """Two shards of three text samples, prepared."""
    text_shards(root)
    prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    return root


def outside_dir(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    return out


def read_all(root: Path, tolerance: int = 100, samples=None):
    """Read the given (default: all) samples of the train split with the Stage-0 reader (no Ray)."""
    table = shard_table(PreparedDataset.open(root, "train"))
    samples = np.arange(table.starts[-1], dtype=np.int64) if samples is None else np.asarray(samples, dtype=np.int64)
    spec = SegmentSpec(worker=0, global_worker=0, seed=0, index=0, start=0, samples=samples, last=True)
    return ReadSegment(table, None, tolerance=tolerance)(spec)


# --- 1. prepare writes nothing through a symlink ------------------------------------------------


def test_prepare_refuses_a_symlinked_nv_meta_folder_and_writes_nothing_outside(tmp_path):
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    (root / ".nv-meta").symlink_to(outside, target_is_directory=True)
    with pytest.raises(DatasetConfigError, match=r"\.nv-meta.*refuses to write through a symlink outside the dataset"):
        prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("split.yaml", TEXT),
        ("dataset.yaml", TEXT),
        ("custom.yaml", dict(TEXT, dataset_config="custom.yaml")),
        (".info.json", TEXT),
        (".info.yaml", TEXT),
        ("index.sqlite", TEXT),
        ("index.uuid", TEXT),
        ("sample_loader.py", dict(sample_type="TextSample", progress=False)),
    ],
)
def test_prepare_refuses_a_symlinked_meta_file_and_leaves_its_target_alone(tmp_path, name, kwargs):
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    (root / ".nv-meta").mkdir()
    target = outside / "target"
    target.write_text("precious")
    (root / ".nv-meta" / name).symlink_to(target)
    with pytest.raises(DatasetConfigError, match=rf"{name}.*refuses to write through a symlink"):
        prepare_dataset(root, split_ratio=[1, 0, 0], force_overwrite=True, **kwargs)
    assert target.read_text() == "precious"
    assert sorted(p.name for p in outside.iterdir()) == ["target"]


def test_prepare_refuses_a_dangling_symlinked_sample_loader(tmp_path):
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    (root / ".nv-meta").mkdir()
    (root / ".nv-meta" / "sample_loader.py").symlink_to(outside / "planted.py")
    with pytest.raises(DatasetConfigError, match="sample_loader.py.*refuses to write through a symlink"):
        prepare_dataset(root, split_ratio=[1, 0, 0], sample_type="TextSample", progress=False)
    assert list(outside.iterdir()) == []


def test_dataset_config_name_may_not_leave_the_nv_meta_folder(tmp_path):
    root = tmp_path / "ds"
    text_shards(root)
    with pytest.raises(ValueError, match=r"must be a file name in .nv-meta, not a path: '../../escaped.yaml'"):
        prepare_dataset(root, split_ratio=[1, 0, 0], dataset_config="../../escaped.yaml", **TEXT)
    assert not (tmp_path / "escaped.yaml").exists() and not (root / ".nv-meta").exists()


@pytest.mark.parametrize(
    "name, message",
    [
        (".info.json", r"must be a .yaml file name, got '.info.json'"),
        ("split.yaml", r"'split.yaml' is a file prepare writes itself"),
        (".info.yaml", r"'.info.yaml' is a file prepare writes itself"),
        ("sub/x.yaml", r"must be a file name in .nv-meta, not a path: 'sub/x.yaml'"),
        ("", r"must be a .yaml file name, got ''"),
    ],
)
def test_a_dataset_config_name_prepare_would_overwrite_or_cannot_write_is_refused_first(tmp_path, name, message):
    """Refused before anything is written (it overwrote prepare's own .info.json or split.yaml,
    leaving a dataset nobody could read, or failed after writing them)."""
    root = tmp_path / "ds"
    text_shards(root)
    with pytest.raises(ValueError, match=message):
        prepare_dataset(root, split_ratio=[1, 0, 0], dataset_config=name, **TEXT)
    assert not (root / ".nv-meta").exists()


def test_prepare_refuses_a_symlinked_tar_idx(tmp_path):
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    target = outside / "target"
    target.write_text("precious")
    (root / "shards" / "shard_0001.tar.idx").symlink_to(target)
    with pytest.raises(DatasetConfigError, match=r"shard_0001\.tar\.idx.*refuses to write through a symlink"):
        prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    assert target.read_text() == "precious"


def test_prepare_names_shard_folders_it_does_not_follow_as_links(tmp_path):
    """Shards behind a linked folder are not indexed (as with Energon's prepare): said in a warning,
    or in the error when no shard is left, not left out silently."""
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    write_shards(outside / "more", text_samples(4), 2, prefix="more")
    (root / "linked").symlink_to(outside / "more", target_is_directory=True)
    result = prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    assert sorted(result.shard_counts) == ["shards/shard_0000.tar", "shards/shard_0001.tar"]
    assert result.warnings[0].startswith("linked/ is a link to a folder, which prepare does not follow: its 2 shard(s)")
    only = tmp_path / "only"
    only.mkdir()
    (only / "shards").symlink_to(outside / "more", target_is_directory=True)
    with pytest.raises(DatasetConfigError, match=r"no .tar/.tgz shards found; shards/ is a link to a folder"):
        prepare_dataset(only, split_ratio=[1, 0, 0], **TEXT)


def test_reindexing_refuses_shards_whose_folder_links_outside_the_dataset(tmp_path):
    root, outside = tmp_path / "ds", outside_dir(tmp_path)
    text_shards(root)
    prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    shutil.move(root / "shards", outside / "shards")
    for idx in (outside / "shards").glob("*.idx"):
        idx.unlink()
    (root / "shards").symlink_to(outside / "shards", target_is_directory=True)
    with pytest.raises(DatasetConfigError, match=r"shard_0000\.tar\.idx.*refuses to write through a symlink"):
        prepare_dataset(root, tar_index_only=True, progress=False)
    assert not list((outside / "shards").glob("*.idx"))


def test_prepare_still_accepts_symlinked_shard_files_and_a_symlinked_root(tmp_path):
    store, root = outside_dir(tmp_path), tmp_path / "ds"
    text_shards(store)
    (root / "shards").mkdir(parents=True)
    for shard in (store / "shards").glob("*.tar"):
        (root / "shards" / shard.name).symlink_to(shard)
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    result = prepare_dataset(tmp_path / "alias", split_ratio=[1, 0, 0], **TEXT)
    assert result.total_samples == 6 and (root / "shards" / "shard_0000.tar.idx").is_file()
    assert not list((store / "shards").glob("*.idx"))


# --- 2. a .tar.idx that misses the tar headers is an error, not a skip -----------------------------


@pytest.mark.parametrize("shift", [7, 512])
def test_misaligned_tar_idx_is_a_shard_read_error_naming_shard_sample_and_fix(tmp_path, shift):
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0001.tar"
    offsets = read_tar_index(shard)
    offsets[1:-1] += shift
    Path(str(shard) + ".idx").write_bytes(offsets.astype(np.uint64).tobytes())
    data = read_all(root, tolerance=1000)
    assert data.fatal is not None and data.fatal[0] == "ShardReadError"
    message = data.fatal[1]
    assert str(shard) in message and re.search(r"sample #\d+ at byte \d+", message)
    assert f"energon-ray prepare --tar-index-only {root}" in message
    assert all(run.failures == 0 for run in data.runs)


def test_misaligned_first_offset_is_an_error_even_when_read_alone(tmp_path):
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0000.tar"
    offsets = read_tar_index(shard)
    offsets[1] -= 512
    Path(str(shard) + ".idx").write_bytes(offsets.astype(np.uint64).tobytes())
    data = read_all(root, tolerance=1000, samples=[1])
    assert data.fatal is not None and data.runs[0].failures == 0
    expected = rf"shard_0000\.tar: sample #1 at byte {int(offsets[1])}: no tar header .*prepare --tar-index-only {root}"
    assert re.search(expected, data.fatal[1])


@pytest.mark.parametrize("entry, value", [(3, 2**63), (0, 2**64 - 1)])
def test_an_index_value_of_2_63_or_more_is_refused_naming_file_entry_and_value(tmp_path, entry, value):
    """uint64 offsets that int64 would wrap to negative: DatasetConfigError naming the .idx, entry and value."""
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0001.tar"
    offsets = read_tar_index(shard).astype(np.uint64)
    offsets[entry] = np.uint64(value)
    Path(str(shard) + ".idx").write_bytes(offsets.tobytes())
    with pytest.raises(DatasetConfigError) as err:
        read_tar_index(shard)
    assert str(err.value).startswith(f"{shard}.idx: entry #{entry} of 4 is {value}, not a byte offset")
    assert f"energon-ray prepare --tar-index-only {root}" in str(err.value)
    with pytest.raises(DatasetConfigError, match=rf"entry #{entry} of 4 is {value}"):
        PreparedDataset.open(root, "train")


def test_a_corrupt_header_at_a_correct_offset_stays_a_counted_skip(tmp_path):
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0001.tar"
    offsets = read_tar_index(shard)
    with open(shard, "r+b") as f:
        f.seek(int(offsets[1]))
        f.write(b"\x00garbage" * 64)
    data = read_all(root)
    assert data.fatal is None
    assert len(data.raw) == 5 and data.runs[0].failures == 1
    assert "shard_0001.tar: sample #1 is not a valid tar record" in data.runs[0].messages[0]


# --- 3. names that are not UTF-8, counts that are not counts ----------------------------------------


def write_tar(path: Path, members) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
        for name, data in members:
            add_member(tar, name, data, mtime=0)


def test_prepare_names_the_shard_and_raw_member_name_that_is_not_utf8(tmp_path):
    root = tmp_path / "ds"
    text_shards(root)
    write_tar(root / "shards" / "shard_0001.tar", [("a.txt", b"a"), (BAD_KEY + ".txt", b"b")])
    with pytest.raises(DatasetConfigError, match=r"shard_0001\.tar: member name b'\\xff\\xfe0001\.txt' is not"):
        prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)


def test_reading_a_member_name_that_is_not_utf8_is_a_named_error(tmp_path):
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0000.tar"
    members = [(f"{key}.txt", parts["txt"]) for key, parts in text_samples(3)]
    members[1] = (BAD_KEY + ".txt", members[1][1])  # same length: the index stays valid
    write_tar(shard, members)
    (index, chunk), = ShardReader(str(shard), "shards/shard_0000.tar", read_tar_index(shard)).read_run(1, 1)
    with pytest.raises(ShardReadError, match=r"shard_0000\.tar: sample #1: member name b'\\xff\\xfe0001\.txt'"):
        parse_sample(chunk, str(shard), index)
    data = read_all(root, tolerance=1000)
    assert data.fatal is None and len(data.raw) == 5
    assert "b'\\xff\\xfe0001.txt' is not valid UTF-8" in data.runs[0].messages[0]


def test_members_that_are_no_sample_part_are_left_out_counted_and_named_by_prepare(tmp_path):
    """``000003`` (no extension), ``.hidden`` and a symlink: left out of every sample, as webdataset leaves them,
    but a prepare warning counts them and names shard and member; folders and ``__meta__`` stay silent."""
    root = tmp_path / "ds"
    text_shards(root)
    shard = root / "shards" / "shard_0001.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, kind in (("sub", tarfile.DIRTYPE), ("__meta__", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info, io.BytesIO(b""))
        for name, data in (("000003.txt", b"3"), ("000003", b"no part"), ("000004.txt", b"4"), (".hidden", b"")):
            add_member(tar, name, data, mtime=0)
        link = tarfile.TarInfo("000004.json")
        link.type, link.linkname = tarfile.SYMTYPE, "000003.txt"
        tar.addfile(link)
    no_ext = "'000003' (no extension: a part is named by what follows the first dot of the file name)"
    expected = f"3 tar member(s) are no sample part and were left out, e.g. shards/shard_0001.tar: {no_ext}"
    result = prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)
    assert result.shard_counts["shards/shard_0001.tar"] == 2 and expected in result.warnings, result.warnings
    skipped = []
    index_dataset(root, ["shards/shard_0001.tar"], progress=False, skipped=skipped)
    assert skipped[1:] == ["shards/shard_0001.tar: '.hidden' (no sample key: the file name starts with a dot)",
                           "shards/shard_0001.tar: '000004.json' (not a regular file)"]
    assert expected in prepare_dataset(root, tar_index_only=True, progress=False).warnings
    data = read_all(root)
    assert data.fatal is None and [sorted(p for p in raw if not p.startswith("__")) for *_, raw in data.raw] == [["txt"]] * 5


def test_prepare_refuses_a_sample_that_holds_a_part_twice_naming_shard_key_and_member(tmp_path):
    """Two ``000001.txt`` members in a row: a reader would keep one caption and drop the other
    silently (webdataset refuses such a sample too)."""
    root = tmp_path / "ds"
    text_shards(root)
    write_tar(root / "shards" / "shard_0001.tar", [("000003.txt", b"3"), ("000004.txt", b"4"), ("000004.txt", b"4b")])
    with pytest.raises(DatasetConfigError, match=r"shard_0001\.tar: sample '000004' \(#1\) holds part 'txt' twice \(member '000004.txt' at byte 2048\)"):
        prepare_dataset(root, split_ratio=[1, 0, 0], **TEXT)


def test_reading_a_sample_that_holds_a_part_twice_is_a_counted_skip_naming_it(tmp_path):
    """A shard indexed elsewhere (no check at prepare): the sample is skipped and counted, its
    shard, key and member named; the other samples are read."""
    from energon_ray.format.tar_index import write_tar_index

    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0000.tar"
    write_tar(shard, [("000000.txt", b"0"), ("000001.txt", b"1"), ("000001.txt", b"one"), ("000002.txt", b"2")])
    with tarfile.open(shard) as tar:
        offsets = [m.offset for m in tar.getmembers()]
        end = tar.offset
    write_tar_index(shard, [offsets[0], offsets[1], offsets[3], end], root)
    (index, chunk), = ShardReader(str(shard), "shards/shard_0000.tar", read_tar_index(shard)).read_run(1, 1)
    with pytest.raises(ShardReadError, match=r"shard_0000\.tar: sample #1 \('000001'\) holds part 'txt' twice \(member '000001.txt'\)"):
        parse_sample(chunk, str(shard), index)
    data = read_all(root)
    assert data.fatal is None and data.runs[0].failures == 1
    assert [raw["__key__"] for _, _, raw in data.raw] == ["000000", "000002", "000003", "000004", "000005"]
    assert "sample #1 ('000001') holds part 'txt' twice" in data.runs[0].messages[0]


@pytest.mark.parametrize("value", ["abc", -1, 2.5, True, None])
@pytest.mark.parametrize("file_name", [".info.json", ".info.yaml"])
def test_a_shard_count_that_is_not_a_count_is_a_config_error_naming_file_and_shard(tmp_path, value, file_name):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    data = {"shard_counts": {"shards/shard_0000.tar": 3, "shards/shard_0001.tar": value}}
    (meta / file_name).write_text(json.dumps(data) if file_name.endswith(".json") else yaml.safe_dump(data))
    with pytest.raises(DatasetConfigError, match=rf"{file_name}: shard_counts\['shards/shard_0001.tar'\] is {value!r}"):
        read_info(tmp_path)


def test_a_legacy_info_yaml_is_read_with_energons_scalar_rules_as_energon_reads_it(tmp_path):
    """PyYAML read the count `010` as 8 (YAML 1.1 octal), where Energon reads 10."""
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / ".info.yaml").write_text("energon_version: on\nshard_counts:\n  shards/a.tar: 010\n  1: 2\n")
    assert read_info(tmp_path) == {"shards/a.tar": 10, "1": 2}


def test_a_listed_shard_gone_with_its_index_is_named_missing_not_told_to_rebuild_its_index(tmp_path):
    """Both gone: the loader said 'missing index, run prepare --tar-index-only', which then failed with a
    bare '[Errno 2] No such file or directory'; both now say the listed shard does not exist."""
    root = prepared_text(tmp_path / "ds")
    shard = root / "shards" / "shard_0001.tar"
    shard.unlink()
    Path(str(shard) + ".idx").unlink()
    with pytest.raises(DatasetConfigError) as opened:
        PreparedDataset.open(root, "train")
    assert str(opened.value) == (
        f"{shard}: shard listed in .nv-meta/.info.json does not exist (nor its index {shard}.idx); restore it, "
        "or prepare the dataset again without it"
    )
    with pytest.raises(DatasetConfigError) as reindexed:
        prepare_dataset(root, tar_index_only=True, progress=False)
    assert str(reindexed.value) == (
        f"{shard}: shard does not exist (listed in .nv-meta/.info.json); restore it, or prepare the dataset again without it"
    )


def test_yaml_aliases_stay_text_as_energon_reads_them_so_a_self_reference_or_bomb_cannot_form(tmp_path, caplog):
    """dataset.yaml subflavors `s: &s {x: 1, self: *s}` were a dict holding itself (save_state_rank then
    failed: 'Circular reference detected'), an alias bomb expanded; Energon reads each alias as its text."""
    root = prepared_text(tmp_path / "ds")
    spec_file = root / ".nv-meta" / "dataset.yaml"
    spec_file.write_text(spec_file.read_text() + "subflavors: &s\n  x: 1\n  self: *s\n  merged: {<<: *s, y: 2}\n")
    spec = PreparedDataset.open(root, "train").spec
    assert spec.subflavors == {"x": 1, "self": "*s", "merged": {"<<": "*s", "y": 2}}
    assert json.loads(json.dumps(spec.subflavors)) == spec.subflavors
    assert "YAML alias '*s' on line 8 is read as the text '*s'" in caplog.text
    bomb = "a: &a [x, x, x]\n" + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert energon_yaml.load(bomb)["i"] == ["*h"] * 9


TAGGED = [
    'a: !!int "7"', "a: !!int '7'", "a: !!str 7", "a: !!float 1", "a: !!bool 'yes'", 'a: !!null ""', "a: !!int |\n  7\n",
    "a: !!binary aGVsbG8=", "a: !!timestamp 2024-01-01", "a: !foo bar", "a: !custom {b: 2}", "a: !!seq [1, x]",
    "a: !!omap [x: 1]", "a: !!python/object/apply:os.system [echo]", 'a: !<tag:yaml.org,2002:int> "5"', '? !!int "3"\n: v',
]


@pytest.mark.parametrize("text", TAGGED)
def test_yaml_tags_are_ignored_as_energons_reader_ignores_them(text):
    """`!!int "7"` was the int 7 here and is the text '7' in Energon (its reader ignores tags; the quotes
    decide); every tagged value reads as Energon's, and no tag names a constructor."""
    from megatron.energon.eyaml import load_yaml

    assert energon_yaml.load(text) == load_yaml(text.encode())


def test_a_tagged_subflavor_in_dataset_yaml_reads_as_energon_reads_it(tmp_path):
    root = prepared_text(tmp_path / "ds")
    spec_file = root / ".nv-meta" / "dataset.yaml"
    spec_file.write_text(spec_file.read_text() + 'subflavors: {n: !!int "7", m: !!str 8, d: !!timestamp 2024-01-01}\n')
    assert PreparedDataset.open(root, "train").spec.subflavors == {"n": "7", "m": 8, "d": "2024-01-01"}


@pytest.mark.parametrize("file_name", [".info.json", ".info.yaml"])
def test_an_info_file_that_is_not_a_mapping_is_a_config_error_naming_it(tmp_path, file_name):
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / file_name).write_text('["shards/shard_0000.tar", 3]')  # JSON, and YAML too
    with pytest.raises(DatasetConfigError, match=rf"{file_name}: has no 'shard_counts' mapping"):
        read_info(tmp_path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(exclude="shards/shard_0001.tar"), r"exclude must be a list .* got str .*write it as a YAML list"),
        (lambda d: d["split_parts"].update(train="shards/shard_0000.tar"), r"split_parts\['train'\] must be a list .* got str"),
        (lambda d: d["split_parts"].update(train=5), r"split_parts\['train'\] must be a list .* got int 5"),
        (lambda d: d.update(exclude=[3]), r"exclude holds 3 \(int\); every entry must be a string"),
    ],
)
def test_split_file_entries_that_are_not_lists_of_names_are_config_errors(tmp_path, edit, message):
    """A split part or exclude written as a plain string (or a number) is refused naming the file
    and the entry: read as a list, a string was taken letter by letter (an exclude silently not
    applied, a split part of one-letter shard names)."""
    from energon_ray.format.split import resolve_split_part

    root = prepared_text(tmp_path / "ds")
    split = root / ".nv-meta" / "split.yaml"
    data = yaml.safe_load(split.read_text())
    edit(data)
    split.write_text(yaml.safe_dump(data))
    with pytest.raises(DatasetConfigError, match=rf"split.yaml: {message}"):
        resolve_split_part(root, "train", read_info(root))
    with pytest.raises(DatasetConfigError, match=message):
        PreparedDataset.open(root, split_part="train")


def test_split_and_dataset_yaml_writers_refuse_symlinked_targets(tmp_path):
    """write_split_file and write_dataset_yaml (also used outside prepare) refuse a symlinked target
    and leave what it points to untouched."""
    from energon_ray.format.dataset_yaml import write_dataset_yaml
    from energon_ray.format.split import write_split_file

    root = prepared_text(tmp_path / "ds")
    outside = tmp_path / "outside.yaml"
    outside.write_text("keep: me\n")
    for name, write in (
        ("split.yaml", lambda: write_split_file(root, {"train": ["shards/shard_0000.tar"]})),
        ("dataset.yaml", lambda: write_dataset_yaml(root, "TextSample", field_map={"text": "txt"})),
    ):
        target = root / ".nv-meta" / name
        target.unlink()
        target.symlink_to(outside)
        with pytest.raises(DatasetConfigError, match="refuses to write through a symlink"):
            write()
        assert outside.read_text() == "keep: me\n"


def test_an_unknown_dataset_yaml_key_is_warned_about_once_naming_file_key_and_close_match(tmp_path, caplog):
    """A typo like 'subflavours' was silently kept in DatasetSpec.extra and read by nothing. Keys of
    Energon's dataset factories are not warned about; nor is rebuilding the spec (as Ray workers do)."""
    import logging
    import pickle

    from energon_ray.format.dataset_yaml import read_dataset_spec

    root = prepared_text(tmp_path / "ds")
    config = root / ".nv-meta" / "dataset.yaml"
    data = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**data, "subflavours": {"a": 1}, "max_samples_per_sequence": 2, "zzz": 1}))
    with caplog.at_level(logging.WARNING, logger="energon_ray"):
        first = PreparedDataset.open(root, "train")
        PreparedDataset.open(root, "train", check=False)
        pickle.loads(pickle.dumps(first.spec))
        read_dataset_spec(root)
    assert [r.getMessage() for r in caplog.records] == [
        f"{config}: unknown key 'subflavours' (did you mean 'subflavors'?); it is ignored",
        f"{config}: unknown key 'zzz'; it is ignored",
    ]
    assert first.spec.subflavors == {}


def test_split_part_names_are_read_as_energon_reads_them(tmp_path):
    """Split parts named yes, on, 1, 2024-01-01 or 1e3 are those names, as in Energon's split.yaml
    reader (PyYAML made them True, True, 1, a date and '1e3': 'unknown split part', or a crash when
    sorting the mixed names); the same shards as Energon's WebdatasetMeta for each."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    from energon_ray.format.split import resolve_split_part

    root = prepared_text(tmp_path / "ds")
    names = ["yes", "on", "1", "2024-01-01", "1e3"]
    (root / ".nv-meta" / "split.yaml").write_text(
        "split_parts:\n" + "".join(f"  {name}: [shards/shard_000{i % 2}.tar]\n" for i, name in enumerate(names)) + "exclude: []\n"
    )
    for i, name in enumerate(names):
        ours = resolve_split_part(root, name, read_info(root)).shards
        theirs = WebdatasetMeta.from_config(EPath(root), split_part=name).split_part_files
        assert list(ours) == theirs == [f"shards/shard_000{i % 2}.tar"], name


# --- split.yaml patterns that expand to huge lists ------------------------------------------------


@pytest.mark.parametrize(
    "part, exclude, message",
    [
        (["shards/data-{0..999999999}.tar"], [], "split_parts['train'] expands to more than 1,000,000 names (at 'shards/data-{0..999999999}.tar')"),
        (["shards/data-0.tar"], ["shards/data-0.tar/{0..9}{0..999}{00..99}{a,b}"], "exclude expands to more than 1,000,000 names"),
        (["shards/data-{0..999999}.tar"], [], "split part 'train' names shard 'shards/data-0.tar', which .nv-meta/.info.json does not list"),
    ],
    ids=["part", "exclude", "unknown-shard"],
)
def test_a_brace_pattern_that_would_expand_without_end_fails_at_once(tmp_path, part, exclude, message):
    """A split.yaml list whose patterns would make more than a million names (``{0..999999999}``:
    braceexpand builds each range it parses, minutes and gigabytes) is a DatasetConfigError naming the
    file before anything is expanded; a part's names are checked against .info.json as they come."""
    import time

    root = prepared_text(tmp_path / "ds")
    (root / ".nv-meta" / "split.yaml").write_text(yaml.safe_dump({"split_parts": {"train": part}, "exclude": exclude}))
    started = time.perf_counter()
    with pytest.raises(DatasetConfigError) as info:
        PreparedDataset.open(root, "train")
    assert str(info.value).startswith(str(root / ".nv-meta" / "split.yaml") + ": ") and message in str(info.value)
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize(
    "pattern",
    ["a.tar", "s/{0..9}.tar", "s/{000..120..3}.tar", "s/{9..-3}", "{a..e}/{x,y{1..4},z}", r"s\{1..9\}/{1,2}", "{a..c..2}{A,{B,C}}", "{,x}{0..0}"],
)
def test_the_expansion_bound_is_never_below_what_braceexpand_makes(pattern):
    """The count the million-name check uses is at least braceexpand's number of names."""
    import braceexpand

    from energon_ray.format.split import expansion_bound

    assert expansion_bound(pattern) >= len(list(braceexpand.braceexpand(pattern))) >= 1
