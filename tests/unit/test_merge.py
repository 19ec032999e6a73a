"""The driver-side merge: round-robin over streams, leftover pooling, caps, drop_last, failures."""

from __future__ import annotations

import pytest

from energon_ray.errors import FatalSampleError
from energon_ray.loader.merge import StreamMerger, merge
from energon_ray.pipeline import rows
from energon_ray.pipeline.policy import StageRun


def _report(worker, segment, runs=()):
    return (rows.REPORT, worker, segment, 99, rows.Report(worker, segment, 0, 0, 0, list(runs)))


def _items(worker, segment, names):
    return [(rows.ITEM, worker, segment, i, n) for i, n in enumerate(names)]


def _pool_batches(worker, group):
    return ["+".join(str(x[2]) for x in group)]


def _run(merger, feed):
    return list(merge(merger, iter(feed)))


def test_round_robin_with_uneven_streams():
    """Streams alternate item by item; an exhausted stream drops out like a torch DataLoader worker."""
    merger = StreamMerger(2, 2, _pool_batches)
    feed = [(r, False) for r in _items(0, 0, ["a0", "a1"])] + [(_report(0, 0), False)]
    feed += [(r, False) for r in _items(1, 0, ["b0"])] + [(_report(1, 0), True)]
    feed += [(r, False) for r in _items(0, 1, ["a2"])] + [(_report(0, 1), True)]
    assert _run(merger, feed) == ["a0", "b0", "a1", "a2"]


def test_leftovers_pool_into_full_batches_in_stream_order():
    """Leftover samples of a stream are batched in the driver once batch_size of them are pooled."""
    merger = StreamMerger(1, 3, _pool_batches)
    feed = [
        ((rows.LEFTOVER, 0, 0, 0, [(0, 0, "s0"), (1, 0, "s1")]), False),
        (_report(0, 0), False),
        ((rows.ITEM, 0, 1, 0, "B1"), False),
        ((rows.LEFTOVER, 0, 1, 1, [(5, 0, "s5"), (6, 0, "s6")]), False),
        (_report(0, 1), False),
        ((rows.LEFTOVER, 0, 2, 0, [(9, 0, "s9")]), False),
        (_report(0, 2), True),
    ]
    assert _run(merger, feed) == ["B1", "s0+s1+s5", "s6+s9"]
    assert merger.stats.driver_batches == 2


def test_drop_last_drops_only_the_final_short_batch():
    """With drop_last the pooled remainder at stream end is dropped."""
    merger = StreamMerger(1, 3, _pool_batches, drop_last=True)
    feed = [((rows.ITEM, 0, 0, 0, "B0"), False), ((rows.LEFTOVER, 0, 0, 1, [(3, 0, "s3")]), False), (_report(0, 0), True)]
    assert _run(merger, feed) == ["B0"]


def test_caps_limit_items_per_stream():
    """Per-stream caps (limit) stop a stream; the merge ends when all are capped."""
    merger = StreamMerger(2, 1, _pool_batches, caps=[2, 1])
    feed = [(r, False) for r in _items(0, 0, ["a0", "a1", "a2"])] + [(_report(0, 0), False)]
    feed += [(r, False) for r in _items(1, 0, ["b0", "b1"])] + [(_report(1, 0), False)]
    assert _run(merger, feed) == ["a0", "b0", "a1"]


def test_failures_are_counted_and_joined_across_segments():
    """Skips are counted per stage; a run of failures spanning segments reaches the tolerance."""
    merger = StreamMerger(1, 1, _pool_batches)
    first = StageRun(stage="load", tolerance=5, lead=0, trail=3, had_success=True, failures=3)
    merger.feed(_report(0, 0, [first]), False)
    assert merger.stats.skipped == {"load": 3}
    second = StageRun(stage="load", tolerance=5, lead=2, trail=2, had_success=False, failures=2, last_error="bad")
    with pytest.raises(FatalSampleError, match="5 consecutive failures in stage 'load'"):
        merger.feed(_report(0, 1, [second]), False)


def test_start_worker_rotates_the_first_stream():
    """start_worker picks the stream that yields first."""
    merger = StreamMerger(2, 1, _pool_batches, start_worker=1)
    feed = [(r, False) for r in _items(0, 0, ["a0"])] + [(_report(0, 0), True)]
    feed += [(r, False) for r in _items(1, 0, ["b0"])] + [(_report(1, 0), True)]
    assert _run(merger, feed) == ["b0", "a0"]
