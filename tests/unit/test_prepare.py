"""``prepare_dataset`` and the ``energon-ray prepare`` / ``info`` commands on tiny synthetic shards (no Ray)."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import sqlite3
import tarfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from energon_ray.cli.main import main
from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.dataset_yaml import read_dataset_spec
from energon_ray.format.pool import process_pool
from energon_ray.format.prepare import prepare_dataset
from energon_ray.format.split import collapse_names, split_by_ratio
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import ShardReader, parse_sample
from energon_ray.synthetic import add_member, captioning_samples, write_shards
from tests.helpers import ONE_PROCESS

FIELD_MAP = {"image": "jpg", "caption": "txt"}
CAPTIONING = dict(sample_type="CaptioningSample", field_map=FIELD_MAP, progress=False)


def make_dataset(root: Path, num: int = 8, per_shard: int = 3, prefix: str = "shard", start: int = 0):
    """Write ``num`` captioning samples as tar shards under ``root/shards``; returns the samples."""
    samples = captioning_samples(num, image_size=(8, 6), start=start)
    write_shards(root / "shards", samples, per_shard, prefix=prefix)
    return samples


def tarfile_offsets(path: Path) -> list:
    """Sample start offsets plus the padded end of the last member, computed independently with tarfile."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    starts, last_key = [], None
    for m in members:
        key = m.name.split(".", 1)[0]
        if key != last_key:
            starts.append(m.offset)
            last_key = key
    last = members[-1]
    return starts + [last.offset_data + (last.size + 511) // 512 * 512]


def run_cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def meta(root: Path, name: str):
    text = (root / ".nv-meta" / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def test_tar_idx_holds_each_samples_first_header_offset_and_the_end(tmp_path):
    make_dataset(tmp_path, num=7, per_shard=3)
    prepare_dataset(tmp_path, split_ratio=[1, 0, 0], **CAPTIONING)
    for shard in sorted((tmp_path / "shards").glob("*.tar")):
        raw = np.fromfile(str(shard) + ".idx", dtype=np.uint64)
        assert raw.tolist() == tarfile_offsets(shard)


def test_minimal_example_writes_energons_info_split_and_dataset_yaml(tmp_path):
    make_dataset(tmp_path)
    result = prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    info = meta(tmp_path, ".info.json")
    assert info["shard_counts"] == {"shards/shard_0000.tar": 3, "shards/shard_0001.tar": 3, "shards/shard_0002.tar": 2}
    assert info["energon_version"].startswith("7.4.1+energonray.")
    assert meta(tmp_path, "split.yaml") == {
        "split_parts": {"train": ["shards/shard_{0000..0001}.tar"], "val": [], "test": ["shards/shard_0002.tar"]},
        "exclude": [],
    }
    assert meta(tmp_path, "dataset.yaml") == {
        "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
        "field_map": FIELD_MAP,
    }
    assert result.part_types == ("jpg", "json", "txt") and result.total_samples == 8


def test_index_sqlite_has_energons_schema_rows_and_a_fresh_uuid(tmp_path):
    samples = make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    offsets = tarfile_offsets(tmp_path / "shards/shard_0000.tar")
    db = sqlite3.connect(tmp_path / ".nv-meta/index.sqlite")
    assert db.execute("SELECT * FROM samples WHERE sample_key = 'sample_000001'").fetchone() == (
        0, "sample_000001", 1, offsets[1], offsets[2] - offsets[1])  # fmt: skip
    last = db.execute("SELECT * FROM samples WHERE sample_key = 'sample_000007'").fetchone()
    assert last[:3] == (2, "sample_000007", 1)
    jpg = db.execute("SELECT * FROM sample_parts WHERE tar_file_id = 0 AND sample_index = 0 AND part_name = 'jpg'")
    assert jpg.fetchone() == (0, 0, "jpg", 512, len(samples[0][1]["jpg"]))
    assert db.execute("SELECT COUNT(*) FROM sample_parts").fetchone() == (24,)
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    assert indexes == {"idx_samples_by_tar_and_idx", "idx_sample_parts_seq", "idx_sample_parts_full"}
    assert uuid.UUID((tmp_path / ".nv-meta/index.uuid").read_text()).version == 4
    assert not (tmp_path / ".nv-meta/index.sqlite.tmp").exists()


def test_prepared_dataset_reads_back_every_sample_with_its_key_and_parts(tmp_path):
    samples = dict(make_dataset(tmp_path))
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    seen = {}
    for part in ("train", "test"):
        ds = PreparedDataset.open(tmp_path, part)
        for shard in ds.shards:
            reader = ShardReader(shard.path, shard.name, read_tar_index(shard.path))
            for i, data in reader.read_run(0, shard.count - 1):
                key, parts, _ = parse_sample(data, shard.name, i)
                seen[key] = parts
            reader.close()
    assert seen == samples


def test_split_parts_match_brace_expanded_regexes_on_shard_paths(tmp_path):
    make_dataset(tmp_path, num=6, per_shard=2, prefix="train")
    make_dataset(tmp_path, num=2, per_shard=1, prefix="val", start=100)
    result = prepare_dataset(tmp_path, split_parts={"train": ["shards/train_.*"], "val": ["shards/val_000{0,1}"]},
                             **CAPTIONING)  # fmt: skip
    assert result.split_parts == {
        "train": ["shards/train_0000.tar", "shards/train_0001.tar", "shards/train_0002.tar"],
        "val": ["shards/val_0000.tar", "shards/val_0001.tar"],
    }
    assert meta(tmp_path, "split.yaml")["split_parts"]["train"] == ["shards/train_{0000..0002}.tar"]
    assert PreparedDataset.open(tmp_path, "val").total == 2


def test_ratio_split_assigns_every_shard_even_when_the_float_sum_ends_below_one():
    names = [f"s_{i}.tar" for i in range(10)]
    splits = split_by_ratio(names, [0.1, 0.2, 0.3])  # Energon drops s_9 here (cumulative 0.999…)
    assert splits == {"train": names[:1], "val": names[1:5], "test": names[5:]}


def test_cli_split_parts_are_repeatable_and_accumulate_per_name(tmp_path):
    make_dataset(tmp_path, num=6, per_shard=2)
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--split-parts", "train:shards/shard_0000",
                  "--split-parts", "train:shards/shard_0002", "--split-parts", "test:shards/shard_0001")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert meta(tmp_path, "split.yaml")["split_parts"] == {
        "train": ["shards/shard_0000.tar", "shards/shard_0002.tar"], "test": ["shards/shard_0001.tar"]}  # fmt: skip


def test_split_parts_win_over_a_split_ratio_given_too_with_a_warning_as_energons_prepare_ignores_the_ratio(tmp_path):
    """Both flags were a usage error ("give --split-ratio or --split-parts, not both", exit 2)."""
    make_dataset(tmp_path)
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--split-ratio", "8,1,1",
                  "--split-parts", "train:shards/shard_000[01]", "--split-parts", "val:shards/shard_0002")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert ("Warning: --split-ratio 8,1,1 is ignored: --split-parts decides the split parts "
            "(as in Energon's prepare)\n") in res.output  # fmt: skip
    assert meta(tmp_path, "split.yaml")["split_parts"] == {
        "train": ["shards/shard_{0000..0001}.tar"], "val": ["shards/shard_0002.tar"]}  # fmt: skip


def test_a_shard_in_two_split_parts_is_kept_as_in_energon_with_a_warning_naming_it_and_the_parts(tmp_path):
    """Overlapping --split-parts put shard_0002 in train and val without a word."""
    make_dataset(tmp_path)
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress",
                  "--split-parts", "train:.*", "--split-parts", "val:.*0002")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Warning: 1 shard(s) are in more than one split part, e.g. shards/shard_0002.tar in 'train' and 'val'\n" in res.output
    assert meta(tmp_path, "split.yaml")["split_parts"] == {
        "train": ["shards/shard_{0000..0002}.tar"], "val": ["shards/shard_0002.tar"]}  # fmt: skip


def test_exclude_drops_matching_shards_everywhere(tmp_path):
    make_dataset(tmp_path)
    result = prepare_dataset(tmp_path, split_ratio=[1, 0, 0], exclude=["shard_0001"], **CAPTIONING)
    assert list(result.shard_counts) == ["shards/shard_0000.tar", "shards/shard_0002.tar"]
    assert meta(tmp_path, "split.yaml")["split_parts"]["train"] == ["shards/shard_0000.tar", "shards/shard_0002.tar"]
    assert not (tmp_path / "shards/shard_0001.tar.idx").exists()


def test_shuffle_tars_uses_random_42_on_the_sorted_list_and_keeps_info_order(tmp_path):
    make_dataset(tmp_path, num=10, per_shard=1)
    names = [f"shards/shard_{i:04d}.tar" for i in range(10)]
    result = prepare_dataset(tmp_path, split_ratio=[8, 1, 1], shuffle_tars=True, **CAPTIONING)
    expected = list(names)
    random.Random(42).shuffle(expected)
    assert result.split_parts == {"train": expected[:8], "val": expected[8:9], "test": expected[9:]}
    assert list(meta(tmp_path, ".info.json")["shard_counts"]) == names


def test_duplicate_key_in_two_shards_is_an_error_naming_both_shards_and_the_key(tmp_path):
    samples = captioning_samples(2, image_size=(8, 6))
    write_shards(tmp_path / "a", samples, 2)
    write_shards(tmp_path / "b", samples[1:], 2)
    with pytest.raises(DatasetConfigError, match=r"'sample_000001'.*a/shard_0000.tar.*b/shard_0000.tar"):
        prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    assert not (tmp_path / ".nv-meta/index.sqlite").exists()
    assert not (tmp_path / ".nv-meta/.info.json").exists()


def test_key_split_into_two_runs_of_one_shard_is_an_error(tmp_path):
    (tmp_path / "s").mkdir()
    with tarfile.open(tmp_path / "s/x.tar", "w") as tar:
        for name in ("a.txt", "b.txt", "a.json"):
            add_member(tar, name, b"1", mtime=0)
    with pytest.raises(DatasetConfigError, match=r"x.tar: duplicate sample key 'a'"):
        prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)


def test_rerun_without_force_fails_with_exit_code_1_naming_nv_meta(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--split-ratio", "8,1,1")
    assert res.exit_code == 1
    assert ".nv-meta/.info.json" in res.output and "--force-overwrite" in res.output
    with pytest.raises(DatasetConfigError, match="already prepared"):
        prepare_dataset(tmp_path, split_ratio=[8, 1, 1], progress=False)


def test_force_overwrite_rewrites_splits_and_regenerates_the_uuid(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    old_uuid = (tmp_path / ".nv-meta/index.uuid").read_text()
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--force-overwrite", "--split-ratio",
                  "1,1,1", "--sample-type", "CaptioningSample", "--field-map", json.dumps(FIELD_MAP))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert meta(tmp_path, "split.yaml")["split_parts"]["val"] == ["shards/shard_0001.tar"]
    assert (tmp_path / ".nv-meta/index.uuid").read_text() != old_uuid


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "title": "txt"}'], 1, "'title'"),
        (["--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg"}'], 1, "required field"),
        (["--sample-type", "CaptioningSample", "--field-map", "{image: jpg}"], 2, "not valid JSON"),
        (["--sample-type", "CaptioningSample", "--field-map", '{"image": "a[", "caption": "txt"}'], 1, "invalid field"),
        (["--sample-type", "CaptionSample"], 2,
         "Invalid value for '--sample-type': unknown sample type 'CaptionSample' (did you mean 'CaptioningSample'?); "
         "known: CaptioningSample, "),
        (["--sample-type", "Foo"], 2, "Invalid value for '--sample-type': unknown sample type 'Foo'; known: "),
        (["--sample-type", "CrudeWebdataset", "--field-map", '{"a": "b"}'], 1, "CrudeWebdataset takes no field_map"),
        (["--field-map", '{"image": "jpg"}'], 1, "field_map needs a sample_type"),
    ],
)
def test_bad_sample_config_fails_before_anything_is_written(tmp_path, args, code, message):
    make_dataset(tmp_path)
    res = run_cli("prepare", tmp_path, "--non-interactive", "--no-progress", "--split-ratio", "8,1,1", *args)
    assert res.exit_code == code and message in res.output, res.output
    assert not (tmp_path / ".nv-meta").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split-parts", "train:.*", "--shuffle-tars"], "--shuffle-tars only applies to --split-ratio, not to --split-parts"),
        (["--tar-index-only", "--split-ratio", "8,1,1", "--exclude", "x", "--sample-type", "TextSample"],
         "--tar-index-only only rebuilds the indexes of the shards in .nv-meta/.info.json; drop --split-ratio, --exclude, --sample-type"),
        (["--split-ratio", "8,1,1", "--fix-duplicates"],  # Energon's option (was click's "No such option")
         "--fix-duplicates: energon_ray does not rewrite tar shards; prepare names each duplicate sample key with both "
         "places it is in: fix those shards and run prepare again"),
    ],
)  # fmt: skip
def test_cli_options_that_do_not_go_together_are_usage_errors_naming_the_flags(tmp_path, args, message):
    """Exit code 2 and the flags' names before anything is read or written (was exit code 1 naming
    prepare_dataset's arguments: 'give exactly one of split_ratio ...', 'drop ['split_ratio', ...]')."""
    make_dataset(tmp_path)
    res = run_cli("prepare", tmp_path, "--non-interactive", "--no-progress", *args)
    assert res.exit_code == 2 and f"Error: {message}\n" in res.output, res.output
    assert not (tmp_path / ".nv-meta").exists()


def test_options_for_tar_datasets_given_with_a_jsonl_file_are_a_usage_error_naming_them(tmp_path):
    """They were ignored without a word (the file indexed, no split or dataset.yaml written)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n{"text": "b"}\n')
    res = run_cli("prepare", corpus, "--non-interactive", "--no-progress", "--split-ratio", "8,1,1",
                  "--sample-type", "TextSample", "--dataset-yaml-name", "d.yaml", "--num-workers", "1")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert (f"Error: {corpus}: a .jsonl file is only indexed (no splits, dataset.yaml or media metadata); "
            "drop --split-ratio, --sample-type, --dataset-yaml-name, --num-workers\n") in res.output  # fmt: skip
    assert not (tmp_path / "corpus.jsonl.idx").exists()
    res = run_cli("prepare", corpus, "--non-interactive", "--no-progress", "--force-overwrite")
    assert res.exit_code == 0 and f"Indexed 2 samples into {corpus}.idx" in res.output, res.output


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(split_ratio=[1, -1, 1]), ">= 0"),
        (dict(split_ratio=[0, 0, 0]), "positive sum"),
        (dict(split_ratio=[8, 1]), "3 entries"),
        (dict(), "exactly one of split_ratio"),
        (dict(split_ratio=[8, 1, 1], split_parts={"train": [".*"]}), "exactly one of split_ratio"),
        (dict(split_parts={"train": ["(unclosed"]}), "not a valid regex"),
        (dict(split_parts={"train": [".*"]}, shuffle_tars=True), "shuffle_tars only applies"),
        (dict(split_ratio=[8, 1, 1], exclude=["[bad"]), "exclude pattern"),
        (dict(split_ratio=[8, 1, 1], num_workers=0), "num_workers"),
        (dict(tar_index_only=True, split_ratio=[8, 1, 1]), "tar_index_only"),
    ],
)
def test_invalid_arguments_raise_value_errors_naming_the_argument(tmp_path, kwargs, message):
    make_dataset(tmp_path, num=3)
    with pytest.raises(ValueError, match=message):
        prepare_dataset(tmp_path, progress=False, **kwargs)


def test_no_shards_and_empty_or_corrupt_shards_are_errors_naming_the_file(tmp_path):
    with pytest.raises(DatasetConfigError, match="no .tar/.tgz shards"):
        prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)
    make_dataset(tmp_path, num=3)
    (tmp_path / "shards/empty.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(DatasetConfigError, match="empty.tar: .*no samples"):
        prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)
    data = (tmp_path / "shards/shard_0000.tar").read_bytes()
    for cut in (2000, 2100):  # inside a header, inside a member's data
        (tmp_path / "shards/empty.tar").write_bytes(data[:cut])
        with pytest.raises(DatasetConfigError, match="empty.tar: (truncated tar|.*unexpected end of data)"):
            prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)
    (tmp_path / "shards/empty.tar").write_bytes(data[:1536] + b"garbage".ljust(512, b"x") + data[2048:])
    with pytest.raises(DatasetConfigError, match="empty.tar: invalid tar header at byte 1536"):
        prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)


def test_two_tars_joined_with_cat_are_refused_instead_of_indexing_only_the_first(tmp_path):
    """tarfile stops at the first tar's end-of-archive marker: the joined shard was indexed with the
    first tar's 3 samples, the second's 2 left out without a word (and lint then found nothing)."""
    make_dataset(tmp_path / "parts", num=5, per_shard=3)
    first, second = (tmp_path / f"parts/shards/shard_000{i}.tar" for i in (0, 1))
    marker, size = tarfile_offsets(first)[-1], first.stat().st_size
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards/joined.tar").write_bytes(first.read_bytes() + second.read_bytes())
    shutil.rmtree(tmp_path / "parts")
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--split-ratio", "1,0,0")
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output == (
        f"Error: {tmp_path / 'shards/joined.tar'}: data at byte {size} follows the tar's end-of-archive marker "
        f"(byte {marker}), which tar readers stop at (tars joined with `cat`?); rebuild the shard as one tar, "
        "e.g. with `tar --concatenate`\n"
    )
    assert not (tmp_path / ".nv-meta/.info.json").exists()


def test_gzip_compressed_shards_are_refused_because_offsets_would_not_be_readable(tmp_path):
    make_dataset(tmp_path, num=3)
    shard = tmp_path / "shards/shard_0000.tar"
    shard.with_suffix(".tgz").write_bytes(gzip.compress(shard.read_bytes()))
    shard.unlink()
    with pytest.raises(DatasetConfigError, match="shard_0000.tgz: gzip-compressed"):
        prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)


def test_hidden_files_and_folders_are_not_shards_and_order_follows_path_components(tmp_path):
    for start, folder in enumerate(("a/b", "a-b", ".hidden", "")):
        write_shards(tmp_path / folder, captioning_samples(1, image_size=(4, 4), start=start), 1)
    write_shards(tmp_path / "a", captioning_samples(1, image_size=(4, 4), start=9), 1, prefix=".dot")
    result = prepare_dataset(tmp_path, split_ratio=[1, 0, 0], progress=False)
    assert list(result.shard_counts) == ["a/b/shard_0000.tar", "a-b/shard_0000.tar", "shard_0000.tar"]


def test_non_interactive_without_sample_type_writes_no_dataset_yaml(tmp_path):
    make_dataset(tmp_path)
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--split-ratio", "8,1,1")
    assert res.exit_code == 0 and "No dataset.yaml written" in res.output
    assert not (tmp_path / ".nv-meta/dataset.yaml").exists()
    assert (tmp_path / ".nv-meta/split.yaml").exists()


def test_sample_type_without_field_map_writes_a_loadable_sample_loader_template(tmp_path):
    make_dataset(tmp_path)
    result = prepare_dataset(tmp_path, split_ratio=[8, 1, 1], sample_type="CaptioningSample", progress=False)
    assert meta(tmp_path, "dataset.yaml")["sample_loader"] == "sample_loader.py:sample_loader"
    spec = read_dataset_spec(tmp_path, trusted=True)
    assert spec.wants_part("jpg") and not spec.wants_part("png")
    assert 'caption=raw["TODO"]' in result.sample_loader.read_text()


def test_crude_webdataset_gets_a_top_level_class(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], sample_type="CrudeWebdataset", progress=False)
    assert meta(tmp_path, "dataset.yaml") == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}


def test_interactive_cli_prompts_for_ratio_sample_type_and_field_map(tmp_path):
    make_dataset(tmp_path)
    # a ratio of two numbers, then one of no weight, are asked again (the first ended the command)
    answers = "\n".join(["8,1", "0,0,0", "8,1,1", "y", "CaptioningSample", "y", "png", "jpg", "txt"]) + "\n"
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--no-progress", input=answers)
    assert res.exit_code == 0, res.output
    assert "Error: split_ratio must have 3 entries (train, val, test), got [8.0, 1.0]" in res.output
    assert "Error: split_ratio entries must be >= 0 with a positive sum, got [0.0, 0.0, 0.0]" in res.output
    assert "No such part" in res.output
    assert meta(tmp_path, "dataset.yaml")["field_map"] == FIELD_MAP
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--no-progress", input="n\n")
    assert res.exit_code == 0 and "Nothing changed" in res.output


def test_tar_index_only_rebuilds_missing_indexes_identically(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    idx = tmp_path / "shards/shard_0001.tar.idx"
    before = idx.read_bytes()
    idx.unlink()
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--tar-index-only", "--no-progress")
    assert res.exit_code == 0, res.output
    assert idx.read_bytes() == before


def test_a_tgz_index_under_energons_name_x_tar_idx_is_read_unless_x_tar_is_a_shard_itself(tmp_path):
    make_dataset(tmp_path, num=6)
    (tmp_path / "shards/shard_0001.tar").rename(tmp_path / "shards/shard_0001.tgz")
    prepare_dataset(tmp_path, split_ratio=[1, 0, 0], **CAPTIONING)
    shard = tmp_path / "shards/shard_0001.tgz"
    expected = read_tar_index(shard)
    Path(f"{shard}.idx").unlink()  # as megatron-energon leaves it: only shard_0001.tar.idx
    assert read_tar_index(shard).tolist() == expected.tolist()
    assert [s.count for s in PreparedDataset.open(tmp_path, "train").shards] == [3, 3]
    (tmp_path / "shards/shard_0001.tar").write_bytes(b"")  # now x.tar.idx would be that shard's index
    with pytest.raises(DatasetConfigError, match=r"shard_0001\.tgz\.idx: missing index of .*shard_0001\.tgz"):
        read_tar_index(shard)


def test_parallel_indexing_writes_the_same_files(tmp_path):
    for name, workers in (("one", 1), ("two", 2)):
        make_dataset(tmp_path / name, num=9, per_shard=2)
        prepare_dataset(tmp_path / name, split_ratio=[8, 1, 1], num_workers=workers, **CAPTIONING)
    for file in ("shards/shard_0003.tar.idx", ".nv-meta/.info.json", ".nv-meta/split.yaml"):
        assert (tmp_path / "one" / file).read_bytes() == (tmp_path / "two" / file).read_bytes()
    rows = [sqlite3.connect(tmp_path / n / ".nv-meta/index.sqlite").execute("SELECT * FROM samples").fetchall()
            for n in ("one", "two")]  # fmt: skip
    assert rows[0] == rows[1]



@pytest.mark.parametrize("command", ["prepare", "prepare-media"])
def test_num_workers_defaults_to_one_process_per_cpu_at_most_16(tmp_path, command):
    """As Energon's default of 16, without oversubscribing a small machine: one per CPU this process may
    use (its affinity, a container's share), at most 16; --help says so."""
    cpus = len(os.sched_getaffinity(0))
    ctx = main.commands[command].make_context(command, [str(tmp_path)])
    assert ctx.params["num_workers"] == min(16, cpus) >= 1
    assert "[default: (one per CPU, at most 16); x>=1]" in " ".join(run_cli(command, "--help").output.split())


#: held by a thread of the test process while a pool starts (see below)
_HELD = threading.Lock()


def _held_lock_free() -> tuple:
    """In a pool worker: its pid and whether it can take ``_HELD`` (a forked child inherits it held)."""
    got = _HELD.acquire(timeout=20)
    if got:
        _HELD.release()
    return os.getpid(), got


def test_worker_pools_are_not_forked_while_other_threads_run(tmp_path):
    """A lock another thread holds at a fork stays held in the forked child for good: a process that
    started Ray or ran torch, then prepares a dataset with workers, could hang. With a thread holding
    a lock, the pool's workers still take it (they are not forked from this process), and
    prepare_dataset with 2 workers writes what 1 worker writes."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with _HELD:
            taken.set()
            release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    taken.wait()
    try:
        pool = process_pool(2)
        try:
            pid, got = pool.submit(_held_lock_free).result(timeout=120)
        finally:
            pool.shutdown()
        assert pid != os.getpid() and got, "a pool worker inherited a lock held by another thread (forked)"
        for name, workers in (("one", 1), ("two", 2)):
            make_dataset(tmp_path / name, num=9, per_shard=2)
            prepare_dataset(tmp_path / name, split_ratio=[8, 1, 1], num_workers=workers, **CAPTIONING)
        for file in ("shards/shard_0003.tar.idx", ".nv-meta/.info.json", ".nv-meta/split.yaml"):
            assert (tmp_path / "one" / file).read_bytes() == (tmp_path / "two" / file).read_bytes()
    finally:
        release.set()
        holder.join()


def test_collapse_names_only_joins_consecutive_equal_width_numbers():
    names = ["a_08.tar", "a_09.tar", "a_10.tar", "a_12.tar", "b9.tar", "b10.tar", "c.tar"]
    assert collapse_names(names) == ["a_{08..10}.tar", "a_12.tar", "b9.tar", "b10.tar", "c.tar"]


def test_collapse_names_counts_up_any_one_number_of_the_name_as_energon_does():
    """Only the last number was collapsed: Energon writes part_{0..2}/s5.tar, we wrote three names."""
    names = ["part_0/s5.tar", "part_1/s5.tar", "part_2/s5.tar", "part_2/s6.tar", "part_2/s7.tar", "x01y5.tar", "x1y6.tar"]
    assert collapse_names(names) == ["part_{0..2}/s5.tar", "part_2/s{6..7}.tar", "x01y5.tar", "x1y6.tar"]


def test_shard_names_with_braces_or_backslashes_are_escaped_in_split_yaml_and_read_back(tmp_path):
    """split.yaml held such names verbatim; brace expansion read 'x{a,b}.tar' as xa.tar, xb.tar and
    'a\\b.tar' as ab.tar, so every read failed with "names shard 'shards/xa.tar', which ... does not list"."""
    make_dataset(tmp_path, num=8, per_shard=2, prefix="b{x}")
    shards = tmp_path / "shards"
    (shards / "b{x}_0000.tar").rename(shards / "a\\b.tar")
    (shards / "b{x}_0003.tar").rename(shards / "x{a,b}.tar")
    res = run_cli("prepare", tmp_path, *ONE_PROCESS, "--non-interactive", "--no-progress", "--split-ratio", "1,0,0",
                  "--sample-type", "CaptioningSample", "--field-map", json.dumps(FIELD_MAP))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert meta(tmp_path, "split.yaml")["split_parts"]["train"] == [
        "shards/a\\\\b.tar", "shards/b\\{x\\}_{0001..0002}.tar", "shards/x\\{a,b\\}.tar"]  # fmt: skip
    ds = PreparedDataset.open(tmp_path, "train")
    assert [s.name for s in ds.shards] == ["shards/a\\b.tar", "shards/b{x}_0001.tar", "shards/b{x}_0002.tar", "shards/x{a,b}.tar"]
    assert ds.total == 8
    res = run_cli("info", tmp_path)
    assert res.exit_code == 0 and "train: 100.0%, 8 samples in 4 shards" in res.output, res.output


def test_info_prints_counts_size_sample_type_splits_and_version(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    res = run_cli("info", tmp_path)
    assert res.exit_code == 0, res.output
    size = sum(p.stat().st_size for p in (tmp_path / "shards").glob("*.tar"))
    assert f"Samples: 8 in 3 shards, {size / 1024:.2f} KiB on disk" in res.output
    assert "megatron.energon.CaptioningSample (field_map: image=jpg, caption=txt)" in res.output
    assert "train: 75.0%, 6 samples in 2 shards" in res.output
    assert "val: 0.0%, 0 samples in 0 shards" in res.output
    assert "test: 25.0%, 2 samples in 1 shards" in res.output
    assert "energon version: 7.4.1+energonray." in res.output


def test_info_on_a_dataset_yaml_that_is_not_a_mapping_fails_naming_it(tmp_path):
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text("- a list\n")
    res = run_cli("info", tmp_path)
    assert res.exit_code == 1 and "dataset.yaml: expected a mapping of keys (sample_type, field_map, ...), got a list" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("command", ["info", "lint", "preview"])
def test_a_split_pattern_with_unbalanced_braces_fails_naming_split_yaml_and_the_pattern(tmp_path, command):
    """A typo in a hand-edited range was a bare braceexpand traceback (info) or an error naming no file."""
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    split = tmp_path / ".nv-meta" / "split.yaml"
    split.write_text(split.read_text().replace("shard_{0000..0001}.tar", "shard_{0000..0001.tar"))
    res = run_cli(command, tmp_path)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output  # no traceback
    assert f"Error: {split}: split_parts['train'] holds 'shards/shard_{{0000..0001.tar', whose braces do not balance" in res.output


def test_info_on_an_unprepared_folder_fails_with_exit_code_1(tmp_path):
    res = run_cli("info", tmp_path)
    assert res.exit_code == 1 and "not a prepared dataset" in res.output


def test_prepare_media_on_an_unprepared_folder_of_tars_fails_naming_the_prepare_command(tmp_path):
    """It said "Stored media metadata of 0 files" (tars are no media files) and wrote .nv-meta/index.sqlite."""
    make_dataset(tmp_path)
    res = run_cli("prepare-media", tmp_path, *ONE_PROCESS, "--media-metadata-by-extension", "--no-progress")
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert (f"Error: {tmp_path}: not a prepared dataset (it holds tar shards, e.g. shards/shard_0000.tar, but no "
            f".nv-meta/.info.json); run `energon-ray prepare {tmp_path}` first\n") in res.output  # fmt: skip
    assert not (tmp_path / ".nv-meta").exists()


def test_version_option_prints_the_package_and_format_version():
    res = run_cli("-V")
    assert res.exit_code == 0 and res.output.startswith("energon-ray ") and "7.4.1" in res.output


@pytest.mark.parametrize("group", [[], ["checkpoint"]])
def test_a_command_group_alone_prints_its_help_with_exit_code_0_as_energons(group):
    res = run_cli(*group)
    assert res.exit_code == 0 and res.output == run_cli(*group, "--help").output


@pytest.mark.parametrize(
    "args, why",
    [
        (["mount", "ds", "/mnt/ds", "-d"], "a FUSE file system over the shards (mfusepy) is not built; the shards are plain "
         "tar files, and `energon-ray preview PATH` prints (and --out draws) their samples"),
        (["analyze-debug", "--help"], "it reads the debug log Energon's worker processes write "
         "(WorkerConfig.worker_debug_path), which energon_ray does not write; `loader.ray_stats()` describes a "
         "loader's Ray tasks"),
    ],
)  # fmt: skip
def test_energons_mount_and_analyze_debug_are_usage_errors_saying_why(args, why):
    """Whatever their options (--help too): exit code 2 naming the command and what to use (was click's
    "No such command"); neither is listed in --help."""
    res = run_cli(*args)
    assert res.exit_code == 2 and res.output.endswith(f"Error: energon-ray has no {args[0]!r} command (Energon's): {why}\n")
    assert args[0] not in run_cli("--help").output


@pytest.mark.parametrize(
    "content, expected",
    [
        ("sample_type: {__module__: megatron.energon, __class__: NoSuchSample}\n", "unknown sample_type 'NoSuchSample'; known: ["),
        ("__module__: megatron.energon\n__class__: NoSuchWebdataset\n", "unknown dataset class 'NoSuchWebdataset'"),
    ],
)  # fmt: skip
def test_info_on_a_dataset_yaml_naming_an_unknown_class_fails_naming_file_and_class(tmp_path, content, expected):
    """It printed "Sample type: megatron.energon.NoSuchSample" and exit 0, for a class every loader refuses."""
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    config = tmp_path / ".nv-meta" / "dataset.yaml"
    config.write_text(content)
    res = run_cli("info", tmp_path)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.startswith(f"Error: {config}: {expected}")


@pytest.mark.parametrize("line", ['[1, 2]', '"text"', '{"a": 1'])
def test_prepare_refuses_a_jsonl_line_that_is_no_object_naming_file_and_line(tmp_path, line):
    """A line that does not start with '{' and end with '}' (Energon's prepare refuses it too): an error naming the file
    and the line number (blank lines count), no index written."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"a": 0}\n\n  ' + line + '  \n{"a": 3}\n')
    res = run_cli("prepare", corpus, "--non-interactive", "--no-progress")
    assert res.exit_code == 1, res.output
    expected = f"{corpus}: line 3 is not a JSON object (a line must start with '{{' and end with '}}'): {line.encode()!r}"
    assert f"Error: {expected}\n" in res.output, res.output
    assert not (tmp_path / "corpus.jsonl.idx").exists()


@pytest.mark.parametrize("name", ["metadataset.yaml", "data.jsonl"])
def test_info_on_a_file_is_a_usage_error_saying_it_takes_a_dataset_folder(tmp_path, name):
    """click said "Directory 'metadataset.yaml' is a file." for a metadataset YAML or a .jsonl."""
    path = tmp_path / name
    path.write_text('{"a": 1}\n')
    res = run_cli("info", path)
    assert res.exit_code == 2, res.output
    assert f"Error: {path}: PATH must be a prepared dataset folder, not a file" in res.output


@pytest.mark.parametrize("name, text", [("split.yaml", "split_parts: [a\n"), ("dataset.yaml", "sample_type: {__class__: X\n")])
def test_info_on_a_meta_file_that_is_not_yaml_fails_with_one_line_naming_file_and_place(tmp_path, name, text):
    """PyYAML's multi-line message, which names "<unicode string>" instead of the file, came out as is."""
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    file = tmp_path / ".nv-meta" / name
    file.write_text(text)
    res = run_cli("info", tmp_path)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.startswith(f"Error: {file}: cannot parse: line ") and res.output.count("\n") == 1, res.output
    assert "<unicode string>" not in res.output


def test_info_shows_dataset_yaml_values_as_the_loader_reads_them_with_energons_scalar_rules(tmp_path):
    """PyYAML read the part name `on` as True (YAML 1.1), where the loader (and Energon) read the text 'on'."""
    make_dataset(tmp_path)
    prepare_dataset(tmp_path, split_ratio=[8, 1, 1], **CAPTIONING)
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: megatron.energon, __class__: CaptioningSample}\nfield_map: {image: jpg, caption: on}\n"
    )
    assert read_dataset_spec(tmp_path).field_map == {"image": [["jpg"]], "caption": [["on"]]}
    res = run_cli("info", tmp_path)
    assert res.exit_code == 0, res.output
    assert "Sample type: megatron.energon.CaptioningSample (field_map: image=jpg, caption=on)\n" in res.output


def test_prepare_on_a_metadataset_yaml_checks_it_as_energon_prepare_does_and_writes_nothing(tmp_path):
    """`energon prepare mix.yaml` prepares a metadataset; ours was a usage error ("must be a dataset folder or a .jsonl file")."""
    make_dataset(tmp_path / "ds")
    prepare_dataset(tmp_path / "ds", split_ratio=[1, 0, 0], **CAPTIONING)
    mix, bad = tmp_path / "mix.yaml", tmp_path / "bad.yaml"
    head = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - weight: 1\n        path: "
    mix.write_text(head + "ds\n")
    bad.write_text(head + "nothere\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_cli("prepare", mix)
    assert res.exit_code == 0, res.output
    assert res.output == f"Checked metadataset {mix}: every split loads; nothing to write (energon_ray joins by key, without a join index)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    res = run_cli("prepare", bad)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output == f"Error: {bad}: splits.train.blend[0]: path 'nothere' does not exist ({tmp_path / 'nothere'})\n"
    res = run_cli("prepare", mix, "--split-ratio", "8,1,1")
    assert res.exit_code == 2 and f"Error: {mix}: a metadataset .yaml is only checked (energon_ray writes no join index); drop --split-ratio\n" in res.output
