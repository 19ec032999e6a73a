"""Energon's metadataset API (load_dataset, get_datasets, traverse_metadataset, get_val_datasets,
prepare_metadataset), checked for exact values and against megatron-energon on the same files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import energon_ray as er
from energon_ray.blend.loaded import DatasetBlendMode, LeafDataset
from energon_ray.errors import DatasetConfigError
from tests.helpers import prefixed_text_dataset

_HEAD = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n"
ENERGON_MESSAGE = "Can only use absolute subset ranges for a leaf dataset (Range parent_subset.absolute_range=({}, {}))"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mds_api")
    prefixed_text_dataset(root / "a", "a", 20, subflavors={"origin": "a", "level": "dataset"})
    prefixed_text_dataset(root / "b", "b", 24)
    files = {
        "inner.yaml": _HEAD + "  train:\n    blend:\n"
        "      - {weight: 3, path: a, subflavors: {level: inner, src: a}}\n"
        "      - {weight: 1, path: b, subset: {range: [0%, 50%]}}\n",
        "outer.yaml": _HEAD + "  train:\n    blend:\n"
        "      - {weight: 4, path: inner.yaml, subflavors: {level: outer}}\n"
        "      - {weight: 1, path: b, subset: {range: [2, 12]}, subflavors: {src: b-direct}}\n"
        "  val:\n    path: a\n    split_part: train\n",
        "epochized.yaml": _HEAD + "  train:\n    blend_epochized:\n"
        "      - {repetitions: 2, path: a}\n      - {repetitions: 0.5, path: b, split_part: train}\n",
        "v1.yaml": "splits:\n  train:\n    datasets:\n      - {weight: 1, path: a, subflavors: {x: 1}}\n"
        "      - {weight: 3, path: b}\n",
        "missing.yaml": _HEAD + "  train:\n    path: missing_ds\n    aux:\n      labels: missing_aux\n"
        "      media: filesystem://media\n",
        "abs_on_blend.yaml": _HEAD + "  train:\n    subset: {range: [5, 9]}\n    blend_epochized:\n"
        "      - {path: a}\n      - {repetitions: 2, path: b}\n",
        "abs_on_nested.yaml": _HEAD + "  train:\n    blend:\n      - {path: inner.yaml, subset: {range: [0, 5]}}\n"
        "      - {path: a}\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def _summary(loaded):
    """(weight, repetitions, folder name, split part, subflavors, len) per leaf."""
    return [(d.weight, d.repetitions, d.dataset.paths[0].name, d.dataset.subflavors, len(d.dataset)) for d in loaded.datasets]


def _energon_wc():
    from megatron.energon import WorkerConfig

    return WorkerConfig(rank=0, world_size=1, num_workers=0)


def test_load_dataset_returns_the_loader_each_kind_of_path_needs(root):
    """A folder gives a DatasetLoader, a V2 file a MetadatasetV2, a V1 file and a dict without __class__ a Metadataset."""
    assert type(er.load_dataset(root / "a")) is er.DatasetLoader
    assert type(er.load_dataset(root / "outer.yaml")) is er.MetadatasetV2
    assert type(er.load_dataset(root / "v1.yaml")) is er.Metadataset
    assert type(er.load_dataset({"splits": {"train": {"datasets": [{"path": str(root / "a")}]}}})) is er.Metadataset
    assert all(isinstance(er.load_dataset(p), er.DatasetLoaderInterface) for p in (root / "a", root / "outer.yaml"))
    with pytest.raises(DatasetConfigError, match=r"Invalid dataset at .*nowhere: it does not exist"):
        er.load_dataset(root / "nowhere")


def test_nested_blend_weights_multiply_and_match_energon(root):
    """outer(4:1) over inner(3:1) gives weights 0.6/0.2/0.2, outer subflavors win over inner and dataset.yaml, as Energon."""
    import megatron.energon as me

    ours = er.load_dataset(root / "outer.yaml").get_datasets(training=True, split_part="train", worker_config=None)
    theirs = me.load_dataset(root / "outer.yaml").get_datasets(training=True, split_part="train", worker_config=_energon_wc())
    assert ours.blend_mode is DatasetBlendMode.DATASET_WEIGHT and ours.blend_mode == theirs.blend_mode  # equal across the libraries
    assert _summary(ours) == [
        (0.6, None, "a", {"origin": "a", "level": "outer", "src": "a"}, 20),
        (0.2, None, "b", {"level": "outer"}, 24),
        (0.2, None, "b", {"src": "b-direct"}, 24),
    ]
    assert _summary(ours) == _summary(theirs)
    assert [d.dataset.subset_range() for d in ours.datasets] == [(0, 20), (0, 12), (2, 12)]


def test_blend_epochized_gives_repetitions_and_v1_gives_weights(root):
    """blend_epochized: repetitions 2 and 0.5, no weights; V1 datasets: weights 0.25/0.75 — both as Energon."""
    import megatron.energon as me

    for name, expected in (
        ("epochized.yaml", [(None, 2.0, "a", {"origin": "a", "level": "dataset"}, 20), (None, 0.5, "b", {}, 24)]),
        ("v1.yaml", [(0.25, None, "a", {"origin": "a", "level": "dataset", "x": 1}, 20), (0.75, None, "b", {}, 24)]),
    ):
        ours = er.load_dataset(root / name).get_datasets(training=True, split_part="train", worker_config=None)
        theirs = me.load_dataset(root / name).get_datasets(training=True, split_part="train", worker_config=_energon_wc())
        assert _summary(ours) == expected == _summary(theirs), name
        assert ours.blend_mode == theirs.blend_mode


def test_dataset_loader_is_one_leaf_without_weight(root):
    """A folder: blend mode NONE, weight None, caller subflavors over dataset.yaml's, the loader's split_part wins."""
    loaded = er.load_dataset(root / "a", split_part="train").get_datasets(
        training=False, split_part="val", worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=0),
        subflavors={"level": "caller"}, subset={"range": ["25%", "75%"]},
    )  # fmt: skip
    assert loaded.blend_mode is DatasetBlendMode.NONE and len(loaded.datasets) == 1
    (only,) = loaded.datasets
    assert isinstance(only.dataset, LeafDataset) and (only.weight, only.repetitions, only.aux) == (None, None, None)
    assert (only.dataset.split_part, only.dataset.subflavors) == ("train", {"origin": "a", "level": "caller"})
    assert only.dataset.subset_range() == (5, 15)


def test_traverse_metadataset_matches_energon(root):
    """Traversal lists resolved paths, split parts and hierarchy-only subflavors of every leaf, like Energon's."""
    import megatron.energon as me

    def flat(refs):
        return [(str(r.path), r.split_part, {k: str(v) for k, v in r.aux.items()}, r.subflavors) for r in refs]

    ours = er.traverse_metadataset(root / "outer.yaml", split_part="train")
    assert flat(ours) == [
        (str(root / "a"), "train", {}, {"level": "outer", "src": "a"}),
        (str(root / "b"), "train", {}, {"level": "outer"}),
        (str(root / "b"), "train", {}, {"src": "b-direct"}),
    ]
    assert flat(ours) == flat(me.traverse_metadataset(root / "outer.yaml", split_part="train"))
    assert flat(er.traverse_metadataset(root / "outer.yaml", split_part="val")) == [(str(root / "a"), "train", {}, {})]
    # a keyword it cannot use is refused, as Energon's metadataset constructor refuses it (it was ignored)
    with pytest.raises(TypeError, match=r"traverse_metadataset: a metadataset takes no \['subflavors'\]"):
        er.traverse_metadataset(root / "outer.yaml", split_part="train", subflavors={"x": 1})
    with pytest.raises(ValueError, match="Unexpected arguments"):
        me.traverse_metadataset(root / "outer.yaml", split_part="train", subflavors={"x": 1})


def test_traverse_keeps_missing_leaves_and_resolves_aux_like_energon(root):
    """A missing leaf is still listed; aux 'x' and 'filesystem://x' resolve next to the YAML, as Energon's."""
    import megatron.energon as me

    (ours,) = er.traverse_metadataset(root / "missing.yaml", split_part="train")
    (theirs,) = me.traverse_metadataset(root / "missing.yaml", split_part="train")
    assert (ours.path, ours.aux) == (root / "missing_ds", {"labels": root / "missing_aux", "media": root / "media"})
    assert (str(ours.path), {k: str(v) for k, v in ours.aux.items()}) == (str(theirs.path), {k: str(v) for k, v in theirs.aux.items()})
    with pytest.raises(DatasetConfigError, match=r"missing.yaml: splits.train: path 'missing_ds' does not exist"):
        er.load_dataset(root / "missing.yaml")


def _keys(loader):
    return [key for batch in loader for key in batch.__key__]


def test_get_val_datasets_gives_one_pass_per_leaf_in_energons_order(root):
    """One (dataset, leaf) per leaf: 20, 12 and 10 keys, exactly Energon's per-leaf keys in order."""
    import megatron.energon as me

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=0)
    ours = er.get_val_datasets(root / "outer.yaml", split_part="train", worker_config=wc, batch_size=3)
    assert [(leaf.path.name, leaf.subset_range()) for _, leaf in ours] == [("a", (0, 20)), ("b", (0, 12)), ("b", (2, 12))]
    our_keys = []
    for dataset, _ in ours:
        loader = er.get_loader(dataset)
        our_keys.append(_keys(loader))
        loader.close()
    assert [len(k) for k in our_keys] == [20, 12, 10]
    assert our_keys[2] == [f"b_{i:06d}" for i in range(2, 12)]
    theirs = me.get_val_datasets(
        root / "outer.yaml", split_part="train", worker_config=_energon_wc(), batch_size=3,
    )  # fmt: skip
    assert our_keys == [_keys(me.get_loader(dataset)) for dataset, _ in theirs]


def test_absolute_subset_above_a_leaf_raises_energons_message(root):
    """An absolute range on a blend or on a nested metadataset raises Energon's sentence, naming file and node."""
    import megatron.energon as me

    cases = (("abs_on_blend.yaml", "splits.train", (5, 9)), ("abs_on_nested.yaml", r"splits.train.blend\[0\]", (0, 5)))
    for name, node, (start, end) in cases:
        message = ENERGON_MESSAGE.format(start, end)
        with pytest.raises(DatasetConfigError, match=rf"{name}: {node}: ") as info:
            er.load_dataset(root / name)
        assert str(info.value).endswith(message)
        with pytest.raises(AssertionError) as theirs:
            me.load_dataset(root / name).get_datasets(training=True, split_part="train", worker_config=_energon_wc())
        assert str(theirs.value) == message
        with pytest.raises(DatasetConfigError, match=r"only use absolute subset ranges for a leaf dataset"):
            er.get_train_dataset(root / name, batch_size=1)


def test_prepare_metadataset_validates_and_writes_nothing(root):
    """prepare_metadataset checks every split's paths and creates no file; a bad reference raises."""
    before = sorted(os.listdir(root))
    assert er.prepare_metadataset(root / "outer.yaml") is None
    assert sorted(os.listdir(root)) == before
    with pytest.raises(DatasetConfigError, match=r"path 'missing_ds' does not exist"):
        er.prepare_metadataset(root / "missing.yaml")
    with pytest.raises(DatasetConfigError, match=r"prepare_metadataset needs a metadataset YAML"):
        er.prepare_metadataset(root / "a")


def test_caller_subflavors_override_every_level_of_the_tree(root):
    """get_val_datasets(subflavors=...) wins over the metadataset levels and dataset.yaml, per leaf, as in Energon."""
    pairs = er.get_val_datasets(root / "outer.yaml", split_part="train", batch_size=2, subflavors={"level": "caller"})
    assert [dataset.subflavors for dataset, _ in pairs] == [
        {"origin": "a", "level": "caller", "src": "a"}, {"level": "caller"}, {"level": "caller", "src": "b-direct"},
    ]
    assert [leaf.subflavors for _, leaf in pairs] == [dataset.subflavors for dataset, _ in pairs]
    import megatron.energon as me

    theirs = me.get_val_datasets(root / "outer.yaml", split_part="train", worker_config=_energon_wc(), batch_size=2,
                                 subflavors={"level": "caller"})  # fmt: skip
    assert [leaf.subflavors for _, leaf in pairs] == [info.subflavors for _, info in theirs]


def test_yaml_scalars_are_read_as_energon_reads_them(root):
    """Unquoted 010, 2024-01-01, 1e-3, on, 1:20 and a key 1 are 10, '2024-01-01', 0.001, 'on', '1:20'
    and '1' (Energon's rules, not PyYAML's 8, date, '1e-3', True, 80, 1), in weights and subflavors."""
    import megatron.energon as me

    (root / "scalars.yaml").write_text(
        _HEAD + "  train:\n    blend:\n"
        "      - {weight: 010, path: a, subflavors: {ver: 2024-01-01, lr: 1e-3, flag: on, t: 1:20, 1: one, q: '5'}}\n"
        "      - {weight: 1e1, path: b}\n"
    )
    subflavors = {"ver": "2024-01-01", "lr": 0.001, "flag": "on", "t": "1:20", "1": "one", "q": "5"}
    ours = er.load_dataset(root / "scalars.yaml").get_datasets(training=True, split_part="train", worker_config=None)
    theirs = me.load_dataset(root / "scalars.yaml").get_datasets(training=True, split_part="train", worker_config=_energon_wc())
    assert _summary(ours) == [(0.5, None, "a", {"origin": "a", "level": "dataset", **subflavors}, 20), (0.5, None, "b", {}, 24)]
    assert _summary(ours) == _summary(theirs)
    (first, _) = er.traverse_metadataset(root / "scalars.yaml", split_part="train")
    assert first.subflavors == subflavors == me.traverse_metadataset(root / "scalars.yaml", split_part="train")[0].subflavors


def test_dataset_yaml_and_a_dataset_config_override_read_scalars_as_energon(tmp_path):
    """subflavors in dataset.yaml and in a YAML's dataset_config file (1e-3, 2024-01-01, on, 010)
    reach the leaf as Energon reads them: 0.001, '2024-01-01', 'on', 10."""
    import megatron.energon as me

    ds = prefixed_text_dataset(tmp_path / "c", "c", 12)
    spec = (ds / ".nv-meta" / "dataset.yaml").read_text().split("subflavors:")[0]
    (ds / ".nv-meta" / "dataset.yaml").write_text(spec + "subflavors: {lr: 1e-3, ver: 2024-01-01}\n")
    (ds / ".nv-meta" / "alt.yaml").write_text(spec + "subflavors: {flag: on, n: 010}\n")
    (tmp_path / "alt.yaml").write_text(_HEAD + "  train:\n    path: c\n    dataset_config: alt.yaml\n")
    cases = ((ds, {"lr": 0.001, "ver": "2024-01-01"}), (tmp_path / "alt.yaml", {"flag": "on", "n": 10}))
    for path, subflavors in cases:
        (ours,) = er.load_dataset(path).get_datasets(training=False, split_part="train", worker_config=None).datasets
        (theirs,) = me.load_dataset(path).get_datasets(training=False, split_part="train", worker_config=_energon_wc()).datasets
        assert ours.dataset.subflavors == subflavors == theirs.dataset.subflavors


def test_leaf_paths_are_absolute_and_normalised_like_energons(root, monkeypatch):
    """'../a' in sub/inner.yaml, opened as the relative 'sub/inner.yaml', is <root>/a in traversal
    and in the loaded leaves (was 'sub/../a'), as Energon's paths are; aux paths too."""
    import megatron.energon as me

    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "inner.yaml").write_text(
        _HEAD + "  train:\n    blend:\n      - {path: ../a, aux: {media: filesystem://../media}}\n      - {path: ./../sub/../b}\n"
    )
    monkeypatch.chdir(root)
    ours = er.traverse_metadataset("sub/inner.yaml", split_part="train")
    assert [(r.path, r.aux) for r in ours] == [(root / "a", {"media": root / "media"}), (root / "b", {})]
    theirs = me.traverse_metadataset("sub/inner.yaml", split_part="train")
    assert [(str(r.path), {k: str(v) for k, v in r.aux.items()}) for r in ours] == [
        (str(r.path), {k: str(v) for k, v in r.aux.items()}) for r in theirs
    ]
    loaded = er.load_dataset("sub/inner.yaml").get_datasets(training=False, split_part="train", worker_config=None)
    assert [d.dataset.paths[0] for d in loaded.datasets] == [root / "a", root / "b"]


def test_a_top_level_path_moves_where_relative_paths_start_as_energons(root, monkeypatch):
    """A YAML in another folder whose top-level ``path:`` names a file beside the datasets (relative:
    from the working directory) was refused as an unknown key; load_dataset, traverse_metadataset and
    get_train_dataset now read its relative paths from that file's folder, as Energon's do."""
    import megatron.energon as me

    (root / "moved").mkdir(exist_ok=True)
    moved = root / "moved" / "m.yaml"
    moved.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\npath: stands_for.yaml\n" + "splits:\n  train:\n    blend:\n      - {weight: 1, path: a}\n      - {weight: 3, path: b}\n")
    monkeypatch.chdir(root)
    ours = [(str(r.path), r.split_part) for r in er.traverse_metadataset(moved, split_part="train")]
    assert ours == [(str(root / "a"), "train"), (str(root / "b"), "train")]
    assert ours == [(str(r.path), r.split_part) for r in me.traverse_metadataset(moved, split_part="train")]
    loaded = er.load_dataset(moved).get_datasets(training=True, split_part="train", worker_config=None)
    assert [(d.weight, d.dataset.paths[0]) for d in loaded.datasets] == [(0.25, root / "a"), (0.75, root / "b")]
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    train = er.get_train_dataset(moved, batch_size=1, worker_config=wc, shuffle_buffer_size=None, max_samples_per_sequence=None)
    assert sorted(os.path.basename(str(leaf.dataset.root)) for leaf in train.leaves()) == ["a", "b"]
