"""Training order: every sample once per epoch, disjoint ranks, seeded, endless streams."""

from __future__ import annotations

import collections

import pytest

import energon_ray as er
from tests.helpers import captioning_dataset, keys_of


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("train") / "ds", n=60, per_shard=8)


ALL_KEYS = [f"sample_{i:06d}" for i in range(60)]


def _train(path, rank=0, world=1, workers=2, seed_offset=0, **kwargs):
    wc = er.WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=seed_offset)
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("shuffle_buffer_size", 10)
    kwargs.setdefault("max_samples_per_sequence", 3)
    return er.get_loader(er.get_train_dataset(path, worker_config=wc, **kwargs))


def test_one_epoch_covers_each_sample_once_and_ranks_are_disjoint(ds_path):
    """With repeat=False each rank's epoch is disjoint from the other's and together they hold every sample once."""
    per_rank = [[k for b in keys_of(_train(ds_path, rank=r, world=2, repeat=False)) for k in b] for r in range(2)]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == ALL_KEYS


def test_batches_are_full_except_each_streams_last(ds_path):
    """Every batch holds batch_size samples except the final one of each stream."""
    sizes = [len(b) for b in keys_of(_train(ds_path, workers=3, batch_size=7, repeat=False))]
    assert sum(sizes) == 60
    assert sizes.count(7) == len(sizes) - sum(1 for s in sizes if s != 7)
    assert sum(1 for s in sizes if s != 7) <= 3


def test_same_config_same_batches_other_seed_offset_other_order(ds_path):
    """Same WorkerConfig → identical batches; another seed_offset → same samples in another order."""
    a = keys_of(_train(ds_path, repeat=False))
    b = keys_of(_train(ds_path, repeat=False))
    c = keys_of(_train(ds_path, repeat=False, seed_offset=1))
    assert a == b
    assert a != c and sorted(sum(a, [])) == sorted(sum(c, [])) == ALL_KEYS


def test_next_pass_is_a_new_shuffle(ds_path):
    """Iterating a repeat=False loader again gives the next epoch: same samples, new order."""
    loader = _train(ds_path, repeat=False)
    first, second = sum(keys_of(loader), []), sum(keys_of(loader), [])
    assert sorted(first) == sorted(second) == ALL_KEYS
    assert first != second


def test_endless_stream_balances_epochs(ds_path):
    """An endless stream visits every sample 3 ± 1 times in 3 epochs' worth of batches."""
    loader = _train(ds_path, workers=2, batch_size=4)
    it = iter(loader)
    keys = [k for _ in range(45) for k in next(it).__key__]
    counts = collections.Counter(keys)
    assert set(counts) == set(ALL_KEYS)
    assert all(2 <= c <= 4 for c in counts.values())
    loader.close()


def test_virtual_epoch_length_continues_the_stream(ds_path):
    """virtual_epoch_length=5 yields 5 batches per iter() and the next iter() continues where it stopped."""
    loader = _train(ds_path, virtual_epoch_length=5)
    reference = _train(ds_path)
    ref_it = iter(reference)
    expected = [next(ref_it).__key__ for _ in range(10)]
    got = keys_of(loader) + keys_of(loader)
    assert len(loader) == 5
    assert got == expected
    loader.close()
    reference.close()
