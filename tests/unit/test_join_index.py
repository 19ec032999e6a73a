"""The join table (no Ray): rows in the primary's order, excludes left out, nonmatch, and Energon's index file."""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pytest

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.join_index import build_join_table
from energon_ray.format.joined import read_join_index
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards

PRIMARY = [f"s_{i:03d}" for i in range(12)]
SECONDARY = [f"s_{i:03d}" for i in range(10, -1, -2)] + ["x_000"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("join_index")
    out = []
    for name, keys, per_shard in (("primary", PRIMARY, 5), ("secondary", SECONDARY, 3)):
        write_shards(root / name / "shards", [(k, {"txt": k.encode()}) for k in keys], per_shard)
        prepare_dataset(root / name, split_ratio=(1, 0, 0), sample_type="TextSample", field_map={"text": "txt"}, progress=False)
        out.append(root / name)
    # the primary excludes one sample (s_002, in its first shard): the join leaves it out
    split = out[0] / ".nv-meta" / "split.yaml"
    split.write_text(split.read_text().replace("exclude: []", "exclude:\n- shards/shard_0000.tar/s_002"))
    return root, out


def _open(paths):
    return [PreparedDataset.open(p, "train") for p in paths]


def _keys(table, col, keys):
    return [None if i < 0 else keys[i] for i in table[:, col]]


def test_rows_follow_the_primary_without_its_excludes(pair):
    """nonmatch none: 11 rows (s_002 excluded), secondary column by key (its own order and shards), -1 where missing."""
    _, paths = pair
    table = build_join_table(_open(paths), ["error", "none"], "here")
    kept = [k for k in PRIMARY if k != "s_002"]
    assert _keys(table, 0, PRIMARY) == kept
    assert _keys(table, 1, SECONDARY) == [k if int(k[2:]) % 2 == 0 else None for k in kept]


def test_skip_drops_rows_and_error_names_the_key(pair):
    _, paths = pair
    table = build_join_table(_open(paths), ["error", "skip"], "here")
    assert _keys(table, 0, PRIMARY) == ["s_000", "s_004", "s_006", "s_008", "s_010"]
    with pytest.raises(DatasetConfigError, match=rf"here: join: sample key 's_001' .* missing from joined dataset #1 {paths[1]}"):
        build_join_table(_open(paths), ["error", "error"], "here")


@pytest.mark.parametrize("nonmatch", ["none", "skip"])
def test_table_equals_energons_join_index(pair, nonmatch):
    """Energon's prepare_metadataset writes the same rows (read back with read_join_index)."""
    from megatron.energon import prepare_metadataset
    from megatron.energon.epathlib import EPath

    root, paths = pair
    yaml = root / f"join_{nonmatch}.yaml"
    yaml.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    join:\n"
        f"      - path: {paths[0]}\n      - path: {paths[1]}\n        nonmatch: {nonmatch}\n"
        "    joiner:\n      __module__: megatron.energon\n      __class__: TextSample\n"
    )
    prepare_metadataset(EPath(yaml))
    (index,) = list((root / f"join_{nonmatch}.yaml.cache").glob("join_index_*.bin"))
    datasets = _open(paths)
    np.testing.assert_array_equal(read_join_index(index, datasets), build_join_table(datasets, ["error", nonmatch], "here"))


def test_a_bad_join_index_is_refused(pair, tmp_path):
    _, paths = pair
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"NOTANIDX" + bytes(8))
    with pytest.raises(DatasetConfigError, match="not a join index"):
        read_join_index(bad, _open(paths))
    with pytest.raises(DatasetConfigError, match="does not exist"):
        read_join_index(tmp_path / "missing.bin", _open(paths))


def test_an_index_sqlite_naming_a_sample_past_its_shards_end_is_refused_naming_key_shard_and_counts(pair, tmp_path):
    """A stale index.sqlite put secondary key s_000 at index 5 of a 3-sample shard: the table named
    sample 8 of 7 (an IndexError deep in the Ray task that read it); the index is now refused."""
    _, paths = pair
    secondary = tmp_path / "secondary"
    shutil.copytree(paths[1], secondary)
    db = sqlite3.connect(secondary / ".nv-meta" / "index.sqlite")
    db.execute("UPDATE samples SET sample_index = 5 WHERE sample_key = 's_000'")
    db.commit()
    db.close()
    with pytest.raises(DatasetConfigError) as info:
        build_join_table(_open([paths[0], secondary]), ["error", "none"], "here")
    assert str(info.value) == (
        f"{secondary / '.nv-meta' / 'index.sqlite'}: sample key 's_000' is at index 5 of shards/shard_0001.tar, which "
        f"holds 3 samples (.nv-meta/.info.json): the index is stale or corrupt; run `energon-ray prepare --tar-index-only "
        f"{secondary}` to rebuild it"
    )


@pytest.mark.parametrize("module", ["megatron.energonx", "megatron.energon_tools", "energon_rayx.joiners"])
def test_a_joiner_module_that_only_starts_like_ours_is_user_code(module):
    """A joiner's module counts as energon_ray's or Energon's only when it is that package or inside it:
    ``megatron.energonx`` (any installed module so named) is user code, refused without the opt-in."""
    from energon_ray.errors import UntrustedCodeError
    from energon_ray.pipeline.join_load import resolve_joiner

    with pytest.raises(UntrustedCodeError, match=rf"joiner {module}\.f would import module '{module}'"):
        resolve_joiner({"__module__": module, "__function__": "f"}, "meta.yaml", trusted=False)


def test_a_joiner_in_our_packages_needs_no_opt_in():
    from energon_ray.pipeline.join_load import resolve_joiner
    from energon_ray.samples.types import TextSample

    assert resolve_joiner({"__module__": "megatron.energon", "__class__": "TextSample"}, "meta.yaml", trusted=False) == TextSample.from_joined
