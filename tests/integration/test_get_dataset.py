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
