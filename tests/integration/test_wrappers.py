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
