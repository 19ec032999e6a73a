"""``join:`` metadatasets: samples of several prepared datasets matched by key, merged by a joiner."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

import energon_ray as er
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
PRIMARY_KEYS = [f"s_{i:03d}" for i in range(20)]
#: the secondary has the even keys (in another order and sharding) and two keys the primary lacks
SECONDARY_KEYS = [f"s_{i:03d}" for i in range(18, -1, -2)] + ["x_000", "x_001"]


def _text_dataset(root: Path, keys: List[str], prefix: str, per_shard: int) -> Path:
    write_shards(root / "shards", [(k, {"txt": f"{prefix}:{k}".encode()}) for k in keys], per_shard)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="TextSample", field_map={"text": "txt"}, progress=False)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("join")
    return {
        "primary": _text_dataset(root / "primary", PRIMARY_KEYS, "p", 7),
        "secondary": _text_dataset(root / "secondary", SECONDARY_KEYS, "s", 4),
        "root": root,
    }


def _yaml(data: Dict[str, Path], name: str, join: str, joiner: str) -> Path:
    path = data["root"] / f"{name}.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        f"    join:\n{join}    joiner:\n{joiner}"
    )
    return path


def _list_join(data, name: str, nonmatch: str) -> Path:
    join = f"      - path: {data['primary']}\n      - path: {data['secondary']}\n        nonmatch: {nonmatch}\n"
    return _yaml(data, name, join, "      __module__: megatron.energon\n      __class__: TextSample\n")


def _samples(path: Path, **kwargs) -> list:
    ds = er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=None, **kwargs)
    loader = er.get_loader(ds)
    try:
        return list(loader)
    finally:
        loader.close()


def test_named_join_with_user_joiner_fills_none_in_primary_order(ray_session, data):
    """nonmatch none: every primary key in the primary's order; odd keys get None, even keys the secondary's text."""
    join = (
        f"      primary:\n        path: {data['primary']}\n"
        f"      secondary:\n        path: {data['secondary']}\n        nonmatch: none\n"
    )
    path = _yaml(data, "named", join, "      __module__: tests.integration.join_types\n      __function__: join_pair\n")
    samples = _samples(path, trust_dataset_code=True)
    assert [s.__key__ for s in samples] == PRIMARY_KEYS
    assert [type(s).__name__ for s in samples] == ["PairSample"] * 20
    assert [(s.first, s.second) for s in samples] == [
        (f"p:s_{i:03d}", f"s:s_{i:03d}" if i % 2 == 0 else None) for i in range(20)
    ]


def test_user_joiner_needs_trust(data):
    """A joiner outside energon_ray / megatron.energon is user code: refused without trust_dataset_code."""
    join = f"      - path: {data['primary']}\n      - path: {data['secondary']}\n        nonmatch: none\n"
    path = _yaml(data, "untrusted", join, "      __module__: tests.integration.join_types\n      __function__: join_pair\n")
    with pytest.raises(er.UntrustedCodeError, match="joiner tests.integration.join_types.join_pair"):
        er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=None)


def test_nonmatch_skip_drops_exactly_the_unmatched(ray_session, data):
    """nonmatch skip: the 10 odd keys are dropped; from_joined takes the secondary's text (later samples win)."""
    ds = er.get_val_dataset(_list_join(data, "skip", "skip"), split_part="train", worker_config=WC, batch_size=None)
    assert len(ds) == 10
    samples = _samples(_list_join(data, "skip", "skip"))
    assert [s.__key__ for s in samples] == PRIMARY_KEYS[::2]
    assert [s.text for s in samples] == [f"s:{k}" for k in PRIMARY_KEYS[::2]]


def test_nonmatch_error_names_key_and_dataset(data):
    """nonmatch error (the default): the first primary key the secondary lacks, and the secondary's path."""
    with pytest.raises(er.DatasetConfigError, match=rf"sample key 's_001' .* missing from joined dataset #1 {data['secondary']}"):
        er.get_val_dataset(_list_join(data, "error", "error"), split_part="train", worker_config=WC, batch_size=None)


def test_primary_must_keep_nonmatch_error(data):
    join = f"      - path: {data['primary']}\n        nonmatch: skip\n      - path: {data['secondary']}\n"
    path = _yaml(data, "bad_primary", join, "      __class__: TextSample\n")
    with pytest.raises(er.DatasetConfigError, match="primary .* must keep nonmatch 'error'"):
        er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=None)


def test_key_order_matches_energon(ray_session, data):
    """Parity: Energon's join (index from prepare_metadataset), one rank, one worker, no shuffle: same keys, same text."""
    import megatron.energon as me
    from megatron.energon.epathlib import EPath

    path = _list_join(data, "parity", "skip")
    me.prepare_metadataset(EPath(path))
    wc = me.WorkerConfig(rank=0, world_size=1, num_workers=1)
    theirs = me.get_val_dataset(path, split_part="train", worker_config=wc, batch_size=3)
    their_batches = [(list(b.__key__), list(b.text)) for b in me.get_loader(theirs)]
    ours = er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=3)
    loader = er.get_loader(ours)
    try:
        our_batches = [(list(b.__key__), list(b.text)) for b in loader]
    finally:
        loader.close()
    assert our_batches == their_batches
    assert len(ours) == len(theirs) == 4  # batches of the 10 joined rows
    assert [k for keys, _ in our_batches for k in keys] == PRIMARY_KEYS[::2]


def test_joined_factory_reads_energons_join_index(ray_session, data):
    """JoinedWebdatasetFactory over Energon's join index file: the rows Energon wrote, joined by a mapping."""
    import megatron.energon as me
    from megatron.energon.epathlib import EPath

    path = _list_join(data, "factory", "none")
    me.prepare_metadataset(EPath(path))
    (index,) = list((data["root"] / "factory.yaml.cache").glob("join_index_*.bin"))
    inner = {
        name: er.StandardWebdatasetFactory(
            data[name], split_part="train", training=False, worker_config=WC, sample_type=er.TextSample,
            field_map={"text": "txt"},
        )
        for name in ("primary", "secondary")
    }  # fmt: skip
    from tests.integration.join_types import join_pair

    factory = er.JoinedWebdatasetFactory(inner, training=False, worker_config=WC, join_index=index, joiner=join_pair)
    assert len(factory) == 20
    loader = er.get_loader(factory.build())
    try:
        samples = list(loader)
    finally:
        loader.close()
    assert [(s.__key__, s.first, s.second) for s in samples] == [
        (k, f"p:{k}", f"s:{k}" if i % 2 == 0 else None) for i, k in enumerate(PRIMARY_KEYS)
    ]


def test_joined_factory_refuses_a_training_that_is_not_a_bool(data):
    """``training="no"`` was truthy (a training pass): refused, as by the other factories."""
    inner = [
        er.StandardWebdatasetFactory(data[name], split_part="train", training=False, worker_config=WC, sample_type=er.TextSample,
                                     field_map={"text": "txt"})
        for name in ("primary", "secondary")
    ]  # fmt: skip
    from tests.integration.join_types import join_pair

    with pytest.raises(TypeError) as info:
        er.JoinedWebdatasetFactory(inner, training="no", worker_config=WC, join_index=data["root"] / "none.bin", joiner=join_pair)
    assert str(info.value) == "JoinedWebdatasetFactory: training must be True or False, got 'no'"


def test_joined_factory_refuses_a_subset_bound_that_is_not_a_number(data):
    """A ``DatasetSubset`` bound like ``'a%'`` is refused naming the factory's paths and the value (a bare
    TypeError when planned before)."""
    from megatron.energon.flavors.webdataset.structs import DatasetSubset

    from tests.integration.join_types import join_pair

    inner = [
        er.StandardWebdatasetFactory(data[name], split_part="train", training=False, worker_config=WC, sample_type=er.TextSample,
                                     field_map={"text": "txt"})
        for name in ("primary", "secondary")
    ]  # fmt: skip
    with pytest.raises(er.DatasetConfigError) as info:
        er.JoinedWebdatasetFactory(inner, training=False, worker_config=WC, subset=DatasetSubset(range=("a%", 1)),
                                   join_index=data["root"] / "none.bin", joiner=join_pair)  # fmt: skip
    assert str(info.value) == (
        f"JoinedWebdatasetFactory({data['primary']}, {data['secondary']}): subset range must be (start, end) ratios "
        "from 0 to 1 (not the metadataset YAML's 'N%'), got ('a%', 1)"
    )


def test_training_join_covers_the_joined_rows_each_epoch(ray_session, data):
    """Training (shuffled, endless): every epoch of 10 samples is the 10 joined keys, each with its own text."""
    ds = er.get_train_dataset(_list_join(data, "train", "skip"), worker_config=WC, batch_size=1,
                              shuffle_buffer_size=4, max_samples_per_sequence=2)  # fmt: skip
    loader = er.get_loader(ds)
    try:
        it = iter(loader)
        batches = [next(it) for _ in range(20)]
    finally:
        loader.close()
    keys = [b.__key__[0] for b in batches]
    assert sorted(keys[:10]) == sorted(keys[10:]) == PRIMARY_KEYS[::2]
    assert all(b.text[0] == f"s:{b.__key__[0]}" for b in batches)


def test_join_state_restore_and_restore_sample(ray_session, data):
    """A saved state of a joined val loader resumes with exactly the rest; restore_sample rebuilds a joined batch;
    get_val_datasets gives the join as one leaf (its len(): the primary's samples, as Energon's factory)."""
    path = _list_join(data, "restore", "skip")

    def make():
        return er.get_savable_loader(er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=2))

    loader = make()
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    state = loader.save_state_rank()
    rest = [(list(b.__key__), list(b.text)) for b in it]
    loader.close()
    assert [k for b in first for k in b.__key__] + [k for keys, _ in rest for k in keys] == PRIMARY_KEYS[::2]
    again = make()
    again.restore_state_rank(state)
    try:
        assert [(list(b.__key__), list(b.text)) for b in again] == rest
        rebuilt = again.restore_sample(first[1].__restore_key__)
    finally:
        again.close()
    assert (list(rebuilt.__key__), list(rebuilt.text)) == (list(first[1].__key__), list(first[1].text))
    [(dataset, leaf)] = er.get_val_datasets(path, split_part="train", worker_config=WC, batch_size=None)
    assert len(leaf) == 20 and len(dataset) == 10


def test_stale_index_sqlite_is_refused_naming_the_datasets(ray_session, data, tmp_path):
    """A secondary shard rewritten after prepare (same sizes, its keys reordered): its index.sqlite names the
    wrong index for four keys. Each joined sample's key is checked, so the read stops with a ShardReadError
    naming both datasets, the keys and the index.sqlite; before, s_012 silently got s_018's text."""
    import shutil

    from energon_ray.synthetic import write_tar

    stale = tmp_path / "stale"
    shutil.copytree(data["secondary"], stale)
    write_tar(stale / "shards" / "shard_0000.tar", [(k, {"txt": f"s:{k}".encode()}) for k in SECONDARY_KEYS[3::-1]])
    join = f"      - path: {data['primary']}\n      - path: {stale}\n        nonmatch: none\n"
    path = _yaml(data, "stale", join, "      __module__: megatron.energon\n      __class__: TextSample\n")
    ds = er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=None)
    loader = er.get_loader(ds)
    got = []
    try:
        with pytest.raises(er.ShardReadError) as info:
            for sample in loader:
                got.append((sample.__key__, sample.text))
    finally:
        loader.close()
    assert str(info.value) == (
        f"join row 12: {data['primary']} gives sample key 's_012' (shard shards/shard_0001.tar), but joined dataset #1 "
        f"{stale} gives 's_018' (shard shards/shard_0000.tar) at the index its .nv-meta/index.sqlite names for that key: "
        "an index.sqlite no longer matches its shards (stale); prepare the datasets again"
    )
    assert all(text in (f"p:{key}", f"s:{key}") for key, text in got)


def test_a_join_whose_rows_changed_but_not_their_count_refuses_a_saved_state(ray_session, data, tmp_path):
    """The primary excluded s_002 when the state was saved and excludes s_004 now: the same 9 joined rows
    in count, other samples. The state restored silently (a join reported no excludes, and its row count
    was all the fingerprint saw), its positions naming other samples; now check_fits raises StateError
    naming the join's rows. With the exclude unchanged it restores as before, and so does a state saved
    before the join's rows were recorded (its fingerprint and summary without them)."""
    from energon_ray.loader.savable import describe
    from energon_ray.loader.state import fingerprint

    import shutil

    primary = tmp_path / "primary"
    shutil.copytree(data["primary"], primary)
    split = primary / ".nv-meta" / "split.yaml"
    original = split.read_text()
    join = f"      - path: {primary}\n      - path: {data['secondary']}\n        nonmatch: skip\n"
    path = _yaml({"root": tmp_path}, "rows", join, "      __module__: megatron.energon\n      __class__: TextSample\n")

    def saved_with(excluded_key):
        split.write_text(original.replace("exclude: []", f"exclude: [shards/shard_0000.tar/{excluded_key}]"))
        return er.get_savable_loader(er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=2))

    loader = saved_with("s_002")
    it = iter(loader)
    assert list(next(it).__key__) == ["s_000", "s_004"]
    state = loader.save_state_rank()
    loader.close()
    moved = saved_with("s_004")
    with pytest.raises(er.StateError, match=r"the state was saved for another dataset configuration: .*joined_rows"):
        moved.restore_state_rank(state)
    moved.close()
    rest = ["s_006", "s_008", "s_010", "s_012", "s_014", "s_016", "s_018"]
    same = saved_with("s_002")
    same.restore_state_rank(state)
    try:
        assert [k for b in same for k in b.__key__] == rest
    finally:
        same.close()
    legacy = saved_with("s_002")
    old = state.to_dict()
    old["fingerprint"] = fingerprint(describe(legacy.dataset, joins=False))
    old["order_fingerprint"] = fingerprint(describe(legacy.dataset, order_only=True, joins=False))
    old["config_summary"] = {k: v for k, v in old["config_summary"].items() if not k.endswith("joined_rows")}
    assert old["fingerprint"] != state.fingerprint and len(old["config_summary"]) == len(state.config_summary) - 1
    legacy.restore_state_rank(old)
    try:
        assert [k for b in legacy for k in b.__key__] == rest
    finally:
        legacy.close()


def test_a_join_state_saved_before_its_rows_were_recorded_restores_into_a_smaller_batch_size(ray_session, data):
    """A join's state saved before the joined rows were recorded (fingerprints and summary without
    them) restores into the saved batch size (above) and, as any state, into a divisor of it: each
    worker stream goes on with the samples it had not given. It was refused, naming
    ``joined_rows was absent`` as if the join had changed."""
    from energon_ray.loader.savable import describe
    from energon_ray.loader.state import fingerprint

    path = _list_join(data, "legacy_rebatch", "skip")

    def loader(batch_size):
        return er.get_savable_loader(er.get_val_dataset(path, split_part="train", worker_config=WC, batch_size=batch_size))

    saved = loader(2)
    it = iter(saved)
    assert list(next(it).__key__) == ["s_000", "s_002"]
    old = saved.save_state_rank().to_dict()
    old["fingerprint"] = fingerprint(describe(saved.dataset, joins=False))
    old["order_fingerprint"] = fingerprint(describe(saved.dataset, order_only=True, joins=False))
    old["config_summary"] = {k: v for k, v in old["config_summary"].items() if not k.endswith("joined_rows")}
    saved.close()
    smaller = loader(1)
    smaller.restore_state_rank(old)
    try:
        assert [list(b.__key__) for b in smaller] == [[f"s_{i:03d}"] for i in range(4, 20, 2)]
    finally:
        smaller.close()
