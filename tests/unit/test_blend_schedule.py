"""The exact schedule a blend gives Ray: its replayed draws match the items it really takes."""

from __future__ import annotations

import itertools

import numpy as np

from energon_ray.blend.base import Composition, PassContext
from energon_ray.blend.compose import BlendDataset, _Draws, _SourceReplay
from energon_ray.worker import WorkerConfig


class _Counter(Composition):
    """An endless leaf whose items name the leaf, worker and item index (no Ray needed)."""

    def __init__(self, name: str, worker_config: WorkerConfig):
        self.name = name
        self.worker_config = worker_config

    def leaves(self):
        return [self]

    def is_endless(self) -> bool:
        return True

    def provider(self, ctx, pass_index):
        counters = [itertools.count() for _ in range(self.num_workers)]
        return lambda worker: (self.name, worker, next(counters[worker]))

    def leaf_shares(self):
        return {id(self): (1.0, 0.0)}


def _taken_steps(blend: BlendDataset, pass_index: int, steps: int):
    """``(leaf, worker, item) -> global step`` as the loader's round-robin over workers takes them."""
    next_item = blend.provider(PassContext({}, stats=None), pass_index)
    taken = {}
    for step in range(steps):
        worker = step % blend.num_workers
        taken[next_item(worker)] = step
    return taken


def test_replayed_draws_give_the_exact_step_of_every_item():
    """For 3 endless sources over 3 workers, ``need(worker, j)`` equals the step that takes item j."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=3, seed_offset=7)
    leaves = [_Counter(n, wc) for n in "abc"]
    blend = BlendDataset((leaves[0], 0.5), (leaves[1], 0.3), (leaves[2], 0.2))
    for pass_index in (0, 1):
        taken = _taken_steps(blend, pass_index, 60000)
        hints = blend.schedule_hints(pass_index)
        assert set(hints) == {id(leaf) for leaf in leaves}
        for (name, worker, item), step in taken.items():  # step order: each (leaf, worker) asks in order
            assert hints[id(leaves["abc".index(name)])](worker, item) == step


def test_replay_keeps_one_chunk_and_restarts_when_asked_backwards():
    """Over ~400k draws the replay holds one chunk of positions; an earlier item still answers exactly."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=1, seed_offset=0)
    blend = BlendDataset((_Counter("a", wc), 0.5), (_Counter("b", wc), 0.5))
    replay = _SourceReplay(lambda: _Draws(wc.worker_seed(0), 0, 0), np.cumsum(blend.weights), 0)
    early = [replay.position(item) for item in range(100)]
    for item in range(0, 200000, 64):
        replay.position(item)
        assert len(replay._found) <= _Draws.CHUNK
    assert 390000 < replay.position(200000) < 410000  # ~2 draws per item of a half-weight source
    assert [replay.position(item) for item in range(100)] == early


def test_zero_weight_source_is_never_needed_and_nested_blends_give_no_hints():
    """A zero-weight source is scheduled last (infinite need); nested blends fall back to shares."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=0)
    a, b, c = (_Counter(n, wc) for n in "abc")
    blend = BlendDataset((a, 1.0), (b, 0.0))
    assert blend.schedule_hints(0)[id(b)](0, 0) == float("inf")
    assert BlendDataset((blend, 0.5), (c, 0.5)).schedule_hints(0) == {}


def test_items_per_step_maps_sample_draws_to_batches():
    """With ``items_per_step`` (a MixBatch's batch size) the step is the batch that takes the item."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=3)
    a, b = _Counter("a", wc), _Counter("b", wc)
    blend = BlendDataset((a, 0.6), (b, 0.4))
    per_item = blend.schedule_hints(0)
    per_batch = blend.schedule_hints(0, items_per_step=4)
    for worker in range(2):
        for j in range(200):
            step = per_item[id(a)](worker, j)
            draw = (step - worker) // 2  # the worker's own draw index
            assert per_batch[id(a)](worker, j) == (draw // 4) * 2 + worker
