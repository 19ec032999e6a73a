"""The pure plan: sharding, slicing, epoch orders, streams and segments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from energon_ray.plan.order import fixed_epoch, interleave, shuffle_buffer, train_epoch_order, val_order
from energon_ray.plan.sharder import bit_reversal_order, compute_subset, global_worker_counts, slice_offsets, worker_ranges
from energon_ray.plan.stream import SegmentLayout, SegmentPlan, StreamConfig, WorkerStream
from energon_ray.worker import WorkerConfig


def test_bit_reversal_examples():
    """Bit reversal of 8 and 6 follows Energon's documented sequences."""
    assert bit_reversal_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reversal_order(6) == [0, 3, 1, 4, 2, 5]
    assert bit_reversal_order(16) == [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15]


def test_worker_ranges_55_samples_4_workers():
    """55 samples over 4 workers give Energon's verified ranges."""
    assert worker_ranges(0, 55, rank=0, world_size=1, num_workers=4) == [(0, 14), (14, 28), (28, 42), (42, 55)]


def test_too_few_samples_per_rank_counts():
    """117 samples over 100 ranks: exactly 17 ranks get 2 samples, spread by bit reversal."""
    counts = global_worker_counts(117, 100)
    assert sorted(counts) == [1] * 83 + [2] * 17
    assert [i for i, c in enumerate(counts) if c == 2] == [0, 3, 6, 12, 18, 25, 31, 37, 43, 50, 56, 62, 68, 75, 81, 87, 93]


def test_ranks_partition_the_samples():
    """The ranges of all ranks and workers tile [start, end) without gaps or overlaps."""
    covered = []
    for rank in range(3):
        covered += worker_ranges(5, 105, rank=rank, world_size=3, num_workers=2, rotation_offset=4)
    flat = [i for a, b in covered for i in range(a, b)]
    assert flat == list(range(5, 105))


def test_slices_cut_at_shards_and_max_samples():
    """Slices never cross a shard and long pieces split into round(len/max) near-equal slices."""
    assert slice_offsets(0, 100, [0, 100], 10) == tuple(range(0, 101, 10))
    assert slice_offsets(0, 100, [0, 100], 30) == (0, 33, 66, 100)
    assert slice_offsets(0, 100, [0, 100], 70) == (0, 100)
    assert slice_offsets(5, 25, [0, 10, 20, 30], None) == (5, 10, 20, 25)
    assert slice_offsets(7, 7, [0, 10], None) == (7,)


def test_subset_absolute_then_ratio():
    """An absolute subset is applied before a ratio subset; bad ranges raise ValueError."""
    assert compute_subset(55, (50, None), None) == (50, 55)
    assert compute_subset(100, (10, 60), (0.0, 0.5)) == (10, 35)
    with pytest.raises(ValueError, match="outside"):
        compute_subset(10, (0, 11), None)


def test_interleave_keeps_lane_order():
    """A random interleave keeps every lane's internal order and all elements."""
    lanes = [np.arange(0, 5), np.arange(100, 103), np.arange(200, 210)]
    out = interleave(lanes, np.random.default_rng(3)).tolist()
    assert sorted(out) == sorted(np.concatenate(lanes).tolist())
    for lane in lanes:
        assert [x for x in out if x in set(lane.tolist())] == lane.tolist()


def test_shuffle_buffer_is_a_bounded_permutation():
    """The shuffle buffer emits a permutation; no element leaves before `size - 1` later ones entered."""
    out = shuffle_buffer(np.arange(1000), 10, np.random.default_rng(0)).tolist()
    assert sorted(out) == list(range(1000))
    assert all(out[k] <= k + 9 for k in range(len(out)))
    assert out != list(range(1000))


def test_train_epoch_is_a_seeded_permutation():
    """An epoch visits every sample once; same seed/epoch → same order; epoch or seed change it."""
    offsets = (0, 10, 20, 35, 50)
    a = train_epoch_order(offsets, seed=1, epoch=0, shuffle_buffer_size=8)
    assert sorted(a.tolist()) == list(range(50))
    assert a.tolist() == train_epoch_order(offsets, seed=1, epoch=0, shuffle_buffer_size=8).tolist()
    assert a.tolist() != train_epoch_order(offsets, seed=1, epoch=1, shuffle_buffer_size=8).tolist()
    assert a.tolist() != train_epoch_order(offsets, seed=2, epoch=0, shuffle_buffer_size=8).tolist()


def test_train_epoch_without_shuffle_and_excludes():
    """shuffle_over_epochs=None reads slices in order; excluded indices are dropped."""
    out = train_epoch_order((0, 5, 10), seed=1, epoch=0, shuffle_over_epochs=None, excluded=np.array([3, 7]))
    assert out.tolist() == [0, 1, 2, 4, 5, 6, 8, 9]
    assert val_order((2, 6), np.array([4])).tolist() == [2, 3, 5]


def test_shuffle_over_epochs_multiplier_repeats_slices():
    """With a multiplier of 2 one plan epoch holds every sample twice."""
    out = train_epoch_order((0, 4, 8), seed=5, epoch=0, shuffle_over_epochs=2)
    assert sorted(out.tolist()) == sorted(list(range(8)) * 2)


def _stream(repeat: bool, training: bool = True, offsets=(0, 6, 10)) -> WorkerStream:
    return WorkerStream(
        StreamConfig(worker=0, global_worker=0, seed=7, offsets=offsets, training=training, repeat=repeat)
    )


@pytest.mark.parametrize(
    "offsets, options, expected",
    [
        ((0, 3, 7, 8, 12), dict(seed=5, epoch=0, shuffle_buffer_size=4), [3, 4, 8, 9, 0, 10, 7, 5, 2, 11, 1, 6]),
        ((10, 11), dict(seed=9, epoch=3, shuffle_buffer_size=100), [10]),
        ((10, 12), dict(seed=9, epoch=3, shuffle_buffer_size=100), [11, 10]),
        ((0, 2, 4, 6), dict(seed=1, epoch=2, shuffle_over_epochs=-1, parallel_shard_iters=2), [2, 4, 3, 5, 2, 3]),
        ((0, 5), dict(seed=2, epoch=1, shuffle_over_epochs=2), [0, 0, 1, 1, 2, 3, 4, 2, 3, 4]),
        ((0, 4, 8), dict(seed=3, epoch=7, shuffle_over_epochs=None, shuffle_buffer_size=3, excluded=np.array([5])), [0, 1, 4, 2, 3, 7, 6]),
    ],
)
def test_train_epoch_orders_stay_what_saved_states_were_made_with(offsets, options, expected):
    """A saved state names stream positions: the order of a seed's epochs must never change (these
    were computed before generators were made only for the steps that draw)."""
    assert train_epoch_order(offsets, **options).tolist() == expected


def test_a_worker_with_one_sample_per_epoch_plans_many_positions_from_one_epoch():
    """A blend member with one or two samples on this rank (many ranks, a small dataset) has an epoch
    per sample or two: its positions are epoch 0 repeated where every epoch is the same, not an
    epoch's order (three seeded generators) computed per position in the training process."""
    one = WorkerStream(StreamConfig(worker=0, global_worker=3, seed=11, offsets=(7, 8), training=True, repeat=True, shuffle_buffer_size=100))
    assert one.samples(5, 10_005).tolist() == [7] * 10_000
    assert one._epoch_cached.cache_info().misses == 1
    config = StreamConfig(worker=0, global_worker=3, seed=11, offsets=(7, 9), training=True, repeat=True)
    two = WorkerStream(config)  # one slice, one lane, no buffer: every epoch is [7, 8]
    assert two.samples(1, 8).tolist() == [8, 7, 8, 7, 8, 7, 8] and two._epoch_cached.cache_info().misses == 1
    shuffled = WorkerStream(dataclasses.replace(config, shuffle_buffer_size=100))  # two samples, shuffled per epoch
    per_epoch = np.concatenate([train_epoch_order((7, 9), seed=11, epoch=e, shuffle_buffer_size=100) for e in range(50)])
    assert shuffled.samples(0, 100).tolist() == per_epoch.tolist() and sorted(set(per_epoch[::2].tolist())) == [7, 8]
    assert [fixed_epoch(o, k, b) for o, k, b in [((7, 8), 3, 100), ((7, 9), 1, None), ((7, 9), 2, None), ((7, 9), 1, 2), ((7, 8, 9), 1, None)]] == [
        True, True, False, False, False
    ]  # fmt: skip


def test_stream_positions_span_epochs():
    """Positions past an epoch continue with the next epoch's order."""
    stream = _stream(repeat=True)
    assert stream.length is None and stream.epoch_length == 10
    assert stream.samples(8, 13).tolist() == stream.epoch(0)[8:].tolist() + stream.epoch(1)[:3].tolist()


def test_finite_stream_clips():
    """A finite stream ends after one epoch."""
    stream = _stream(repeat=False, training=False)
    assert stream.length == 10
    assert stream.samples(8, 20).tolist() == [8, 9]
    assert stream.samples(10, 20).tolist() == []


def test_segment_plan_rounds_and_last_flags():
    """Segments are cut at multiples of the segment length, round-major, the last one flagged."""
    streams = [
        _stream(repeat=False, training=False, offsets=(0, 10)),
        _stream(repeat=False, training=False, offsets=(10, 14)),
    ]
    plan = SegmentPlan(streams, 4)
    assert plan.num_segments(0) == 3 and plan.num_segments(1) == 1 and plan.num_rounds == 3
    specs = plan.rounds(0, 3)
    assert [(s.worker, s.index, s.samples.tolist(), s.last) for s in specs] == [
        (0, 0, [0, 1, 2, 3], False),
        (1, 0, [10, 11, 12, 13], True),
        (0, 1, [4, 5, 6, 7], False),
        (0, 2, [8, 9], True),
    ]



def test_segment_plan_with_short_first_rounds_covers_every_position_once():
    """Each worker's first segments are short, the rest long; together they cover the stream exactly,
    and a position maps back to the segment that holds it."""
    streams = [
        _stream(repeat=False, training=False, offsets=(0, 10)),
        _stream(repeat=False, training=False, offsets=(10, 13)),
    ]
    layout = SegmentLayout(length=4, first_length=2, first_rounds=2)
    plan = SegmentPlan(streams, layout)
    assert plan.num_segments(0) == 4 and plan.num_segments(1) == 2 and plan.num_rounds == 4
    assert [(s.worker, s.index, s.start, s.samples.tolist(), s.last) for s in plan.rounds(0, 4)] == [
        (0, 0, 0, [0, 1], False),
        (1, 0, 0, [10, 11], False),
        (0, 1, 2, [2, 3], False),
        (1, 1, 2, [12], True),
        (0, 2, 4, [4, 5, 6, 7], False),
        (0, 3, 8, [8, 9], True),
    ]
    assert [layout.index(p) for p in range(10)] == [0, 0, 1, 1, 2, 2, 2, 2, 3, 3]
    assert SegmentLayout.from_list(layout.to_list()) == layout


def test_default_segments_are_short_first_then_long_unless_the_user_sets_a_length(tmp_path):
    """Default: each worker's first segment is one of 64 samples (quick first batch), later ones 128 (fewer
    blocks for the trainer), fewer with more than 8 workers; ``samples_per_segment`` makes them all
    that long. Segments the loader's tasks run several at a time are one batch long."""
    import energon_ray as er
    from tests.helpers import captioning_dataset

    path = captioning_dataset(tmp_path / "ds", n=20, per_shard=10)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    default = er.get_train_dataset(path, batch_size=32, worker_config=wc, max_samples_per_sequence=5)
    assert default.segment_layout == SegmentLayout(128, first_length=64, first_rounds=1)
    chosen = er.get_train_dataset(path, batch_size=32, worker_config=wc, max_samples_per_sequence=5, samples_per_segment=96)
    assert chosen.segment_layout == SegmentLayout(96)
    assert default.task_samples is None  # one segment a task
    # a sample blend's leaf (unchained) and a chained leaf among several: one-batch segments, which
    # the loader's tasks run several at a time (64 samples in each slot's first task, then 128)
    blend_leaf = er.get_train_dataset(path, batch_size=32, worker_config=wc, max_samples_per_sequence=5)
    blend_leaf.options.blend_samples = True  # a leaf of a blend_samples=True metadataset
    assert blend_leaf.segment_layout == SegmentLayout(32, first_length=8, first_rounds=1)  # its first batch draws from every leaf
    assert blend_leaf.task_samples == (64, 128)
    among = er.get_train_dataset(path, batch_size=8, worker_config=wc, max_samples_per_sequence=5)
    among.run_as_tasks(True, several=True)
    assert (among.segment_layout, among.task_samples) == (SegmentLayout(32), (64, 128))
    among.run_as_tasks(False, several=True)  # executor="ray_data": Ray Data's read tasks, as before
    assert (among.segment_layout, among.task_samples) == (SegmentLayout(128, first_length=64, first_rounds=1), None)
    blend_leaf.run_as_tasks(False)
    assert (blend_leaf.segment_layout, blend_leaf.task_samples) == (SegmentLayout(128, first_length=64, first_rounds=1), None)
    big_batches = er.get_train_dataset(path, batch_size=100, worker_config=wc, max_samples_per_sequence=5)
    assert big_batches.segment_layout == SegmentLayout(200, first_length=100, first_rounds=1)
    both = er.get_train_dataset(path, batch_size=4, worker_config=wc, max_samples_per_sequence=5, samples_per_segment=(6, 16))
    assert both.segment_layout == SegmentLayout(16, first_length=8, first_rounds=1)
    # many worker streams: shorter later segments (all streams' segments aim for 1024 samples), but
    # never less than a batch, and not where the user chose a length
    def layout(workers, **kw):
        wcw = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        return er.get_train_dataset(path, worker_config=wcw, max_samples_per_sequence=5, **kw).segment_layout

    assert layout(8, batch_size=32) == SegmentLayout(128, first_length=64, first_rounds=1)
    assert layout(16, batch_size=32) == SegmentLayout(64)
    assert layout(32, batch_size=32) == SegmentLayout(32)
    assert layout(64, batch_size=32) == SegmentLayout(32)
    assert layout(16, batch_size=100) == SegmentLayout(100)
    assert layout(12, batch_size=8) == SegmentLayout(88, first_length=64, first_rounds=1)
    assert layout(16, batch_size=32, samples_per_segment=128) == SegmentLayout(128)
    for bad in ((8,), (0, 8), (8, 2.5), "8"):
        with pytest.raises(ValueError, match="samples_per_segment"):
            er.get_train_dataset(path, batch_size=4, worker_config=wc, max_samples_per_sequence=5, samples_per_segment=bad)

def test_worker_seed_matches_energon_rule():
    """Stream seeds follow Energon's sha1(f'{gid},{seed_offset}') rule and depend on seed_offset."""
    import hashlib

    wc = WorkerConfig(rank=1, world_size=2, num_workers=3, seed_offset=5)
    expected = int.from_bytes(hashlib.sha1(b"4,5").digest(), "big") & 0xFFFFFFFF
    assert wc.worker_seed(1) == expected
    assert WorkerConfig(rank=0, world_size=1, num_workers=0).global_worker_id() == 0
    assert wc.worker_seed(1) != WorkerConfig(rank=1, world_size=2, num_workers=3).worker_seed(1)


@pytest.mark.parametrize("rank, world_size", [("x", "2"), ("2", "2"), ("-1", "2"), ("0", "")])
def test_a_bad_rank_or_world_size_in_the_environment_is_named(monkeypatch, rank, world_size):
    """The default WorkerConfig reads $RANK/$WORLD_SIZE (outside ray.train and torch.distributed): values
    that are no rank of a world name both variables (before: int()'s "invalid literal for int() with base
    10: 'x'", or "WorkerConfig.rank must be in [0, 2)" for RANK=2, naming neither)."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    with pytest.raises(ValueError) as caught:
        WorkerConfig.default_worker_config()
    assert str(caught.value) == (
        f"the environment's RANK={rank!r} and WORLD_SIZE={world_size!r} (the default WorkerConfig's rank and world "
        "size) must be whole numbers with 0 <= RANK < WORLD_SIZE; fix them, or pass a worker_config"
    )
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert (WorkerConfig.default_worker_config().rank, WorkerConfig.default_worker_config().world_size) == (1, 3)


def test_energon_s_debug_log_options_are_warned_about_once_each(caplog):
    """worker_debug_path and worker_log_level (Energon's worker debug log, which is not written here) are
    accepted with one warning each per process, as get_loader's ignored options are; unset, nothing is said."""
    import logging

    caplog.set_level(logging.WARNING, logger="energon_ray")
    WorkerConfig(rank=0, world_size=1, num_workers=1)
    for _ in range(2):
        WorkerConfig(rank=0, world_size=1, num_workers=1, worker_debug_path="/tmp/debug", worker_log_level=1)
    assert [r.getMessage() for r in caplog.records] == [
        f"WorkerConfig(): {name}= is a megatron.energon option for its workers' debug log, which energon_ray does not "
        "write; ignored (loader.stats and loader.ray_stats() describe the Ray tasks)"
        for name in ("worker_debug_path", "worker_log_level")
    ]


def test_worker_config_validation():
    """Bad WorkerConfig values raise with the field name."""
    with pytest.raises(ValueError, match="rank"):
        WorkerConfig(rank=2, world_size=2, num_workers=0)
    with pytest.raises(ValueError, match="num_workers"):
        WorkerConfig(rank=0, world_size=1, num_workers=-1)
