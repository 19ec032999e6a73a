"""A state restored into a smaller batch size saves and restores again: exactly at the new size, and
into a size smaller still (each worker stream's rest carried on each time)."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.helpers import captioning_dataset, keys_of


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("rebatch") / "ds", n=50, per_shard=7)


def loader(path, batch_size):
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    return er.get_savable_loader(er.get_val_dataset(path, split_part="train", worker_config=wc, batch_size=batch_size))


def streams(batches):
    """Each worker stream's samples, flattened (worker ``w`` reads samples 25w to 25w+24)."""
    out = [[], []]
    for keys in keys_of(batches):
        out[int(keys[0][-6:]) // 25].extend(keys)
    return out


def test_a_rebatched_pass_saves_and_restores_exactly_and_into_a_smaller_size_again(path):
    """Saved after 3 batches of 4, restored into 2 and saved (as JSON) after 5 more: restored into
    2 it gives exactly the rest; restored into 1 (and through restore_state_global), each worker
    stream's rest in the same order; and every stream's samples are the saved loader's, none twice."""
    first = loader(path, 4)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    saved = first.save_state_rank()
    following = list(it)
    halves = loader(path, 2)
    halves.restore_state_rank(saved)
    it = iter(halves)
    middle = [next(it) for _ in range(5)]
    state = halves.save_state_rank().to_json()
    rest = list(it)
    assert streams(middle + rest) == streams(following)
    again = loader(path, 2)
    again.restore_state_rank(state)
    assert keys_of(again) == keys_of(rest)
    ones = loader(path, 1)
    ones.restore_state_global([state])
    single = list(ones)
    assert all(len(keys) == 1 for keys in keys_of(single))
    assert streams(single) == streams(rest)
    assert sorted(k for s in streams(head + middle + single) for k in s) == [f"sample_{i:06d}" for i in range(50)]
