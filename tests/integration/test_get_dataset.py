"""get_dataset(training=...): exactly get_train_dataset / get_val_dataset, arguments of the other pass refused."""

from __future__ import annotations

import itertools

import pytest

import energon_ray as er
from energon_ray.format.dataset_yaml import write_dataset_yaml
from tests.helpers import keys_of, text_dataset

WC = dict(worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2))


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    """Four shards of 6 text samples; two shards train, one val, one test."""
    return text_dataset(tmp_path_factory.mktemp("get_dataset") / "ds", [6, 6, 6, 6], split_ratio=(2, 1, 1))


def _keys(dataset) -> list:
    return keys_of(er.get_loader(dataset))


def test_validation_is_get_val_dataset_batch_for_batch(ds_path):
    """training=False reads the "val" part by default and yields get_val_dataset's batches, key for key."""
    ours = _keys(er.get_dataset(ds_path, training=False, batch_size=4, **WC))
    theirs = _keys(er.get_val_dataset(ds_path, batch_size=4, **WC))
    assert ours == theirs == [["000012", "000013", "000014"], ["000015", "000016", "000017"]]  # 2 streams of 3
    assert _keys(er.get_dataset(ds_path, training=False, split_part="test", batch_size=3, limit=1, **WC)) == _keys(
        er.get_val_dataset(ds_path, split_part="test", batch_size=3, limit=1, **WC)
    )


def test_training_is_get_train_dataset_batch_for_batch(ds_path):
    """training=True reads "train" by default, shuffled with the same seed: get_train_dataset's exact batches."""
    args = dict(batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=2, repeat=False, **WC)
    ours = _keys(er.get_dataset(ds_path, training=True, **args))
    theirs = _keys(er.get_train_dataset(ds_path, **args))
    assert ours == theirs and sorted(sum(ours, [])) == [f"{i:06d}" for i in range(12)]  # the two train shards


def test_raw_samples_without_batching_or_task_encoder(ds_path):
    """batch_size=None and no task encoder: one TextSample per item, the val part in get_val_dataset's order."""
    samples = list(er.get_loader(er.get_dataset(ds_path, training=False, batch_size=None, **WC)))
    assert all(isinstance(s, er.TextSample) for s in samples)
    assert [s.__key__ for s in samples] == [
        s.__key__ for s in er.get_loader(er.get_val_dataset(ds_path, batch_size=None, **WC))
    ]


@pytest.mark.parametrize(
    "training, kwargs, message",
    [
        (False, dict(batch_size=2, shuffle_buffer_size=10), r"training=False\): shuffle_buffer_size only applies to training"),
        (False, dict(batch_size=2, repeat=False, virtual_epoch_length=5), r"virtual_epoch_length, repeat only"),
        (True, dict(batch_size=2, limit=3), r"training=True\): limit only applies to validation"),
        (None, dict(batch_size=2), r"needs training=True or training=False, got None"),
        ("yes", dict(batch_size=2), r"got 'yes'"),
        (True, dict(), r"get_dataset\(\) needs batch_size="),
    ],
)
def test_bad_arguments_are_type_errors_naming_them(ds_path, training, kwargs, message):
    """A wrong pass's argument, a non-bool training, a missing batch_size: TypeError naming it."""
    with pytest.raises(TypeError, match=message):
        er.get_dataset(ds_path, training=training, **kwargs)


def test_dataset_code_stays_refused_without_the_opt_in(tmp_path, monkeypatch):
    """A dataset with a sample_loader.py is refused for both passes unless trust_dataset_code=True."""
    monkeypatch.delenv("ENERGON_RAY_TRUST_DATASET_CODE", raising=False)
    path = text_dataset(tmp_path / "ds", [4, 4])
    write_dataset_yaml(path, "TextSample", sample_loader="sample_loader.py:load", part_filter=["txt"])
    (path / ".nv-meta" / "sample_loader.py").write_text("def load(raw):\n    return {'text': 'loaded ' + raw['txt']}\n")
    for training in (True, False):
        with pytest.raises(er.UntrustedCodeError, match="sample_loader.py.*trust_dataset_code=True"):
            er.get_dataset(path, training=training, split_part="train", batch_size=2)
    dataset = er.get_dataset(path, training=False, split_part="train", batch_size=None, trust_dataset_code=True, **WC)
    assert sorted(s.text for s in er.get_loader(dataset)) == sorted(f"loaded {i}" for i in range(8))


def test_a_relative_path_is_read_from_the_callers_directory(tmp_path, monkeypatch):
    """A dataset path relative to the caller's directory, whose Ray workers run in another one (the
    session Ray's; a cluster's): the same batches as the absolute path, in validation and in training
    (the dataset.yaml shipped with each segment was read again in the worker's directory: 'dataset
    config not found')."""
    text_dataset(tmp_path / "ds", [6, 6, 6, 6], split_ratio=(1, 0, 0))

    def batches(path):
        train = er.get_loader(er.get_train_dataset(path, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=3, **WC))
        first = keys_of(itertools.islice(train, 12))
        train.close()
        return _keys(er.get_val_dataset(path, split_part="train", batch_size=4, **WC)), first

    expected = batches(str(tmp_path / "ds"))
    monkeypatch.chdir(tmp_path)
    assert batches("ds") == expected and [len(e) for e in expected] == [6, 12]


class WarnedHere(er.DefaultTaskEncoder):
    """Reports, from the Ray worker that encodes the sample, which config files this process warned about."""

    def encode_sample(self, sample):
        import os

        from energon_ray.blend import metadataset
        from energon_ray.format import dataset_yaml

        from energon_ray.errors import noticed

        warned = sorted(noticed(dataset_yaml.LEGACY_CLASS)) + sorted(f for f, _ in noticed(metadataset.SUBFLAVOR))
        return {"__key__": sample.__key__, "subflavors": sample.__subflavors__, "pid": os.getpid(), "warned": warned}


def test_deprecated_config_is_warned_about_once_in_the_trainer_and_never_in_ray_workers(tmp_path, monkeypatch):
    """A legacy `__class__: TextWebdataset` dataset.yaml and a V1 metadataset's `subflavor:` give Energon's
    FutureWarnings, each naming its file, once, while the loader is built; the Ray workers that re-read
    the dataset config to decode the samples warn about neither."""
    import os

    import yaml

    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", "off")  # every sample encoded in a Ray worker
    root = text_dataset(tmp_path / "ds", [4])
    config = root / ".nv-meta" / "dataset.yaml"
    config.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "TextWebdataset", "field_map": {"text": "txt"}}))
    mds = tmp_path / "mix.yaml"
    mds.write_text(f"splits:\n  train:\n    datasets:\n      - {{weight: 1, path: {root}, subflavor: old}}\n")
    with pytest.warns(FutureWarning) as caught:
        loader = er.get_loader(er.get_val_dataset(mds, split_part="train", batch_size=None, task_encoder=WarnedHere(), **WC))
    assert [str(w.message).split(": ")[:2] for w in caught] == [
        [str(mds), "splits.train.blend[0]"], [str(config), "__class__"],
    ]
    assert "subflavor is deprecated" in str(caught[0].message) and "TextWebdataset is deprecated" in str(caught[1].message)
    items = list(loader)
    assert [item["__key__"] for item in items] == ["000000", "000002", "000001", "000003"]  # 2 workers in turn
    assert all(item["subflavors"] == {"__subflavor__": "old"} and item["pid"] != os.getpid() for item in items)
    assert not {str(config), str(mds)} & {f for item in items for f in item["warned"]}
