"""Energon's wrappers over Ray-backed datasets: ``get_savable_loader`` restores them exactly."""

from __future__ import annotations

import collections

import pytest

import energon_ray as er
from tests.helpers import prefixed_text_dataset
from tests.roundtrip import END, assert_round_trip, json_transport

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return prefixed_text_dataset(tmp_path_factory.mktemp("wrappers") / "w", "w", 26, per_shard=6)


class _Run:
    """A savable loader as ``assert_round_trip`` drives it (items as tuples of keys)."""

    def __init__(self, build):
        self.loader = er.get_savable_loader(build())
        self.it = None

    def __next__(self):
        if self.it is None:
            self.it = iter(self.loader)
        try:
            item = next(self.it)
        except StopIteration:
            self.it = None
            return END
        return tuple(item) if isinstance(item, list) else item.__key__

    def save(self):
        return self.loader.save_state_rank()

    def restore(self, state):
        self.loader.restore_state_rank(state)


def test_endless_repeat_of_shuffled_batches_restores_exactly(path):
    """Repeat(None) over a shuffle buffer of filtered, grouped-by-batch training samples: any k restores."""

    def build():
        ds = er.get_train_dataset(path, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
                                  repeat=False, worker_config=WC, samples_per_segment=4)  # fmt: skip
        kept = er.FilterDataset(ds, filter_fn=lambda s: not s.__key__.endswith("7"))
        batched = er.BatchDataset(er.ShuffleBufferDataset(kept, 5), 3, lambda ss: [s.__key__ for s in ss])
        return er.RepeatDataset(batched, repeats=None)

    runs = []

    def make():
        runs.append(_Run(build))
        return runs[-1]

    try:
        items = assert_round_trip(make, [3, 11], count=16, transport=json_transport)
    finally:
        for run in runs:
            run.loader.close()
    # 16 batches are two repetitions' worth; the buffer of 5 mixes items across the seams
    keys = collections.Counter(k for item in items for k in item)
    assert END not in items and sum(keys.values()) == 48 and len(keys) == 24 and set(keys.values()) <= {1, 2, 3}
    assert not any(k.endswith("7") for k in keys)


def test_a_state_saved_after_a_break_from_an_epochized_loader_restores_the_next_full_epoch(path):
    """A ``break`` ends an epochized loader's ``iter()``: the next ``iter()`` is a full new epoch. A
    state saved after the break restored the rest of the broken epoch instead (2 of 5 items, then
    every later epoch shifted by 3)."""

    def build():
        ds = er.get_val_dataset(path, split_part="train", batch_size=None, worker_config=WC)
        return er.EpochizeDataset(er.RepeatDataset(ds, repeats=None), 5)

    saved, restored = er.get_savable_loader(build()), er.get_savable_loader(build())
    try:
        for i, _ in enumerate(saved):
            if i == 2:
                break
        state = json_transport(saved.save_state_rank())
        assert state.epoch_items == 0
        expected = [[s.__key__ for s in saved] for _ in range(2)]
        restored.restore_state_rank(state)
        assert [[s.__key__ for s in restored] for _ in range(2)] == expected
        assert [len(epoch) for epoch in expected] == [5, 5]
        # an older iterator dropped after a newer one began leaves the newer one's count alone
        old = iter(saved)
        next(old)
        new = iter(saved)
        next(new), next(new)
        del old
        assert json_transport(saved.save_state_rank()).epoch_items == 2
    finally:
        saved.close()
        restored.close()
