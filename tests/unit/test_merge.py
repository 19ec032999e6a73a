"""Driver-side ordering: per-worker queues with leftover pooling, and the round-robin over workers."""

from __future__ import annotations

import gc

import pytest

from energon_ray.errors import FatalSampleError
from energon_ray.loader.events import place_events
from energon_ray.loader.merge import EXHAUSTED, NOTHING, Pending, WorkerQueues
from energon_ray.loader.round_robin import round_robin
from energon_ray.loader.stats import HandlerCall, LoaderStats
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.located import BlockRefs, Located, resolve_located
from energon_ray.pipeline.policy import Failure, FailureChain, StageRun


def _report(worker, segment, runs=()):
    return (rows.REPORT, worker, segment, 99, rows.Report(worker, segment, 0, 0, 0, list(runs)))


def _pool_batches(worker, groups):
    """Like the seam tasks: one task for the groups, its batches made when the queue reaches it."""
    return [Pending(lambda: ["+".join(str(x[2]) for x in group) for _, group in groups])]


def _drain(queues: WorkerQueues, worker: int):
    out = []
    while (item := queues.pop(worker)) is not NOTHING:
        out.append(item)
    return out


def test_round_robin_with_uneven_streams():
    """Workers alternate item by item; an exhausted worker drops out like a torch DataLoader worker."""
    streams = {0: iter(["a0", "a1", "a2"]), 1: iter(["b0"]), 2: iter([])}
    out = list(round_robin(3, lambda w: next(streams[w], EXHAUSTED)))
    assert out == ["a0", "b0", "a1", "a2"]


def test_round_robin_caps_and_start_worker():
    """Per-worker caps (limit) stop a worker; start_worker picks the first one."""
    streams = {0: iter(["a0", "a1", "a2"]), 1: iter(["b0", "b1"])}
    assert list(round_robin(2, lambda w: next(streams[w], EXHAUSTED), caps=[2, 1], start_worker=1)) == ["b0", "a0", "a1"]


def test_items_queue_per_worker_in_plan_order():
    """ITEM rows queue per worker; the last segment's report closes the worker."""
    q = WorkerQueues(2, 2, _pool_batches)
    q.feed((rows.ITEM, 0, 0, 0, "a0"), False)
    q.feed((rows.ITEM, 1, 0, 0, "b0"), False)
    q.feed(_report(1, 0), True)
    assert list(q.queues[0]) == ["a0"] and list(q.queues[1]) == ["b0"]
    assert q.done == [False, True] and q.pop(1) == "b0" and q.pop(1) is NOTHING


def test_leftovers_pool_into_full_batches_in_stream_order():
    """Leftover samples of a worker are batched in the driver once batch_size of them are pooled."""
    q = WorkerQueues(1, 3, _pool_batches)
    for row, last in [
        ((rows.LEFTOVER, 0, 0, 0, [(None, 3, [(0, 0, "s0"), (1, 0, "s1")])]), False),
        (_report(0, 0), False),
        ((rows.ITEM, 0, 1, 0, "B1"), False),
        ((rows.LEFTOVER, 0, 1, 1, [(None, 3, [(5, 0, "s5"), (6, 0, "s6")])]), False),
        (_report(0, 1), False),
        ((rows.LEFTOVER, 0, 2, 0, [(None, 3, [(9, 0, "s9")])]), False),
        (_report(0, 2), True),
    ]:
        q.feed(row, last)
    assert _drain(q, 0) == ["B1", "s0+s1+s5", "s6+s9"]
    assert q.stats.seam_batches == 2


def test_keyed_samples_fill_buckets_across_segments_like_energon():
    """Grouped batching: buckets fill across segments in stream order (a bucket started in one
    segment completes with the next one's samples); the rest flush in first-seen bucket order."""
    calls = []

    def batches(worker, groups):
        calls.append(len(groups))
        return _pool_batches(worker, groups)

    q = WorkerQueues(1, None, batches)

    def keyed(*pairs):
        return [(key, 2, [(int(name[1:]), 0, name)]) for key, name in pairs]

    q.feed((rows.LEFTOVER, 0, 0, 0, keyed(("b", "s0"), ("a", "s1"), ("a", "s2"), ("c", "s3"))), False)
    q.feed(_report(0, 0), False)
    q.feed((rows.LEFTOVER, 0, 1, 0, keyed(("c", "s4"), ("b", "s5"), ("a", "s6"))), False)
    q.feed(_report(0, 1), True)
    assert _drain(q, 0) == ["s1+s2", "s3+s4", "s0+s5", "s6"]
    assert calls == [1, 2, 1]


def test_drop_last_drops_only_the_final_short_batch():
    """With drop_last the pooled remainder at stream end is dropped."""
    q = WorkerQueues(1, 3, _pool_batches, drop_last=True)
    q.feed((rows.ITEM, 0, 0, 0, "B0"), False)
    q.feed((rows.LEFTOVER, 0, 0, 1, [(None, 3, [(3, 0, "s3")])]), False)
    q.feed(_report(0, 0), True)
    assert _drain(q, 0) == ["B0"]


def test_failures_are_counted_and_joined_across_segments():
    """Skips are counted per stage; a run of failures spanning segments reaches the tolerance."""
    q = WorkerQueues(1, 1, _pool_batches)
    first = StageRun(stage="load", tolerance=5, lead=0, trail=3, had_success=True, failures=3)
    q.feed(_report(0, 0, [first]), False)
    assert q.stats.skipped == {"load": 3}
    second = StageRun(stage="load", tolerance=5, lead=2, trail=2, had_success=False, failures=2, last_error="bad")
    q.feed(_report(0, 1, [second]), False)  # queued: raised when the consumer reaches it
    for _ in range(2):  # and again if asked again
        with pytest.raises(FatalSampleError, match="5 consecutive failures in stage 'load'"):
            q.pop(0)


def test_segments_made_again_after_a_restore_are_counted_once():
    """A restore to a checkpoint (Ray lost the execution) takes back what the segments from there were
    counted for, so the segments made again count once: counters, and the worker's run of failures
    (it ends the segment and goes on into the next one) as before them."""
    q = WorkerQueues(1, 1, _pool_batches)
    ok = rows.Report(0, 0, 4, 4, 4, [StageRun(stage="load", tolerance=5, had_success=True)], node="n1")
    q.feed((rows.ITEM, 0, 0, 0, "b0"), False, [0], q.account(ok))
    q.feed((rows.REPORT, 0, 0, 9, ok), False, None, [])
    tail = rows.Report(0, 1, 4, 1, 1, [StageRun(stage="load", tolerance=5, trail=3, had_success=True, failures=3)], node="n1")
    events = q.account(tail)
    q.feed((rows.ITEM, 0, 1, 0, "b1"), False, [4], events)
    q.feed((rows.REPORT, 0, 1, 9, tail), False, None, [])
    assert q.pop(0) == "b0"
    state = q.state(0)
    assert (state.checkpoint.segment, q.chain.runs_of(0)) == (1, {(0, "load"): 3})
    q.restore(0, state, {})
    assert (q.stats.samples_read, q.stats.skipped, q.stats.segments_per_node, q.chain.runs_of(0)) == (4, {}, {"n1": 1}, {(0, "load"): 0})
    events = q.account(tail)  # made again
    q.feed((rows.ITEM, 0, 1, 0, "b1"), False, [4], events)
    q.feed((rows.REPORT, 0, 1, 9, tail), True, None, [])
    assert _drain(q, 0) == ["b1"] and q.done[0]
    assert (q.stats.samples_read, q.stats.skipped, q.stats.segments_per_node) == (8, {"load": 3}, {"n1": 2})
    assert q.chain.runs_of(0) == {(0, "load"): 3}  # not 6: the segment's trailing failures once


def test_fatal_report_raises_in_plan_order():
    """A report carrying a fatal error raises it when the consumer reaches it: after the items
    queued before it (the segment's own, made before the error), as Energon's worker raises it."""
    q = WorkerQueues(1, 1, _pool_batches)
    report = rows.Report(0, 0, 0, 0, 1, [], fatal=("ShardReadError", "x.tar: truncated"))
    from energon_ray.errors import ShardReadError

    q.feed((rows.ITEM, 0, 0, 0, "b0"), False)
    q.feed((rows.REPORT, 0, 0, 1, report), False)
    assert q.pop(0) == "b0"
    with pytest.raises(ShardReadError, match="x.tar: truncated"):
        q.pop(0)


def test_chained_sources_batch_across_the_end_of_one_into_the_next():
    """A validation concatenation: the first source's remainder opens the second one's first batch,
    even when the second source's rows arrive before the first one's stream ends."""
    first, second = WorkerQueues(1, 3, _pool_batches), WorkerQueues(1, 3, _pool_batches)
    first.chain_to(second)

    def pooled(segment, *names):
        return (rows.LEFTOVER, 0, segment, 0, [(None, 3, [(int(n[1:]), 0, n) for n in names])])

    second.feed(pooled(0, "b0", "b1", "b2", "b3"), False)
    second.feed(_report(0, 0), True)
    assert second.waiting == [True] and _drain(second, 0) == []
    first.feed(pooled(0, "a0", "a1", "a2", "a3"), False)
    first.feed(_report(0, 0), True)
    assert _drain(first, 0) == ["a0+a1+a2"]
    assert _drain(second, 0) == ["a3+b0+b1", "b2+b3"]
    assert first.done == second.done == [True]


def test_hand_out_queues_give_samples_one_by_one_after_each_report_and_save_the_pool():
    """A sample blend's leaf: a segment's samples are handed out (never batched here) only once its
    report arrived; the state is the pool now plus the next segment (a half-fed segment is fed again)."""
    q = WorkerQueues(1, 3, _pool_batches, hand_out=True, leaf=2)
    q.feed((rows.LEFTOVER, 0, 0, 0, [(None, 3, [(0, 0, "s0"), (1, 0, "s1")])]), False)
    assert q.pop(0) is NOTHING  # staged until the report
    q.feed(_report(0, 0), False)
    assert q.pop(0) == (0, 0, "s0", 2)
    q.feed((rows.LEFTOVER, 0, 1, 0, [(None, 3, [(5, 0, "s5")])]), False)
    state = q.state(0)
    assert (state.checkpoint.segment, state.checkpoint.pools, state.consumed) == (1, [(None, 0, [(2, 1, 0)])], 0)
    q.feed(_report(0, 1), True)
    assert [q.pop(0), q.pop(0), q.pop(0)] == [(1, 0, "s1", 2), (5, 0, "s5", 2), NOTHING]
    assert q.done[0] and q.stats.seam_batches == 0


def test_located_leftovers_resolve_to_the_sample_bytes_of_their_block():
    """The trainer of a sample blend pools where each sample lies (a block row's number, row, group,
    item); shipped, each becomes the ``Located`` of its block (whose reference is let go after its
    last sample), and the batching task reads exactly those bytes from the block."""
    leftovers = rows.pack_leftovers([(None, 2, [(4, 0, {"k": "a"}), (7, 1, {"k": "b"})])], worker=0, segment=3)
    block = rows.table([(rows.ITEM, 0, 3, 0, "batch"), (rows.LEFTOVER, 0, 3, 1, leftovers)])
    decoded = rows.iter_rows(block)
    next(decoded)
    payload = serde.loads(next(decoded)[4], copy=False)
    refs = BlockRefs()
    located = refs.locate(payload, "block-ref", 1)
    pooled = [p for _, _, p in located[0][2]]
    assert pooled == [(0, 1, 0, 0), (0, 1, 0, 1)] and len(refs) == 1
    gc.collect()
    assert not any(gc.is_tracked(item) for item in located[0][2])  # pooled, the collector ignores them
    shipped = [refs.ship(pooled[1]), refs.ship(b"as is")]
    assert shipped == [Located("block-ref", 1, 0, 1), b"as is"] and len(refs) == 1
    assert refs.ship(pooled[0]) == Located("block-ref", 1, 0, 0) and len(refs) == 0  # the block's last sample: let go
    with pytest.raises(RuntimeError, match="shipped twice"):
        refs.ship(pooled[0])
    fetched = []
    groups = resolve_located([(2, [(4, 0, shipped[0]), (9, 0, b"as is")])],
                                  lambda refs: fetched.extend(refs) or [block])  # fmt: skip
    assert fetched == ["block-ref"]
    (size, [(p1, _, first), (p2, _, second)]), = groups
    assert size == 2 and (p1, p2) == (4, 9) and second == b"as is"
    assert serde.loads(first) == {"k": "b"}


def _chained_report(segment, before, outputs, tail_from):
    report = rows.Report(0, segment, 0, outputs, 0, [], outputs_before=before, tail_from=tail_from)
    return (rows.REPORT, 0, segment, 99, report)


def test_chain_points_reach_back_to_where_the_open_batch_began():
    """A chained stream (batch 4): a checkpoint names the segment the open batch's first output
    came from, the outputs before that segment and the batch's first position; none when no batch
    is open; a segment of few outputs makes the point reach further back."""
    q = WorkerQueues(1, 4, _pool_batches, chained=True)
    assert q.chain_point(0) is None  # the stream's start
    q.feed((rows.ITEM, 0, 0, 0, "B0"), False)
    q.feed(_chained_report(0, 0, 6, 4), False)  # 6 outputs: one batch, 2 open (positions from 4)
    q.feed((rows.ITEM, 0, 1, 0, "B1"), False)
    assert q.log.records[0][q.log.tags[0][-1]][0].chain == [0, 0, 4]
    q.feed(_chained_report(1, 6, 1, 4), False)  # 1 output: 3 open, from segment 0 on (its tail: 2 + 1)
    assert q.chain_point(0) == (0, 0, 4)
    q.feed(_chained_report(2, 7, 5, 20), False)  # 12 outputs in all: no batch open
    assert q.chain_point(0) == (3, 12, None)
    q.feed(_chained_report(3, 12, 9, 30), False)
    assert q.chain_point(0) == (3, 12, 30)
    assert WorkerQueues(1, 4, _pool_batches).chain_point(0) is None  # not chained: no chain points


# -- where a report's handler calls and fatal errors go (``place_events``) -----------------------


def test_place_events_puts_each_before_the_first_row_holding_a_later_sample():
    """Energon's worker meets a failure while making the batch its next good sample goes into: the
    event goes before the first row holding a sample after it; rows without positions take the next
    known one's; the last row (the report) takes the rest, in order."""
    events = [(1, 1, "f1"), (2, 5, "f5"), (3, 8, "b8"), (4, 20, "f20"), (9, None, "fatal")]
    #           item [0,2,3]  item(no pos) item [4,6,7]  leftover [9]  report
    bounds = [3, None, 7, 9, None]
    assert place_events(events, bounds) == [["f1"], ["f5"], [], ["b8"], ["f20", "fatal"]]
    assert place_events([], bounds) == [[], [], [], [], []]
    assert place_events(events[:1], [None, None]) == [[], ["f1"]]  # a sample blend's rows: all at the report


def _call(stage, key, at, seq):
    return HandlerCall(stage, Failure(ValueError(f"bad {key}"), key, [], at, seq))


def test_handler_calls_run_where_the_consumer_reaches_them_and_once_after_a_restore():
    """A queued ``HandlerCall`` calls the user's handler when the consumer passes it (a handler that
    raises stops the stream there, its batches before handed out); after a restore, the calls before
    the consumed items are not made again, the next one is."""
    calls = []
    stats = LoaderStats()
    stats.error_handler = lambda exc, item, sources: calls.append(item)
    q = WorkerQueues(1, 1, _pool_batches, stats=stats)
    q.feed((rows.ITEM, 0, 0, 0, "b0"), False, [0], [])
    q.feed((rows.ITEM, 0, 0, 1, "b2"), False, [2], [_call("encode_sample", "s1", 1, 1)])
    q.feed((rows.ITEM, 0, 0, 2, "b4"), False, [4], [_call("encode_sample", "s3", 3, 2)])
    q.feed(_report(0, 0), True, None, [])
    assert q.pop(0) == "b0" and calls == []  # s1 failed after b0's samples: its call comes after b0
    assert q.pop(0) == "b2" and calls == ["s1"]
    state = q.state(0)
    assert q.pop(0) == "b4" and calls == ["s1", "s3"]
    # a restored queue: the segment is fed again, b0 and b2 were consumed
    again = WorkerQueues(1, 1, _pool_batches, stats=stats)
    again.restore(0, state, {})
    again.feed((rows.ITEM, 0, 0, 0, "b0"), False, [0], [])
    again.feed((rows.ITEM, 0, 0, 1, "b2"), False, [2], [_call("encode_sample", "s1", 1, 1)])
    again.feed((rows.ITEM, 0, 0, 2, "b4"), False, [4], [_call("encode_sample", "s3", 3, 2)])
    again.feed(_report(0, 0), True, None, [])
    calls.clear()
    assert _drain(again, 0) == ["b4"] and calls == ["s3"]

    def abort(exc, item, sources):
        raise exc

    stats.error_handler = abort
    q = WorkerQueues(1, 1, _pool_batches, stats=stats)
    q.feed((rows.ITEM, 0, 0, 0, "b0"), False, [0], [])
    q.feed((rows.ITEM, 0, 0, 1, "b2"), False, [2], [_call("encode_sample", "s1", 1, 1)])
    assert q.pop(0) == "b0"
    with pytest.raises(ValueError, match="bad s1"):
        q.pop(0)


def test_a_run_joined_across_segments_is_fatal_at_the_failure_that_makes_the_tolerance():
    """``FailureChain.check`` names where the joined run became too long: the lead failure that made
    ``tolerance`` in a row (its position and order, its message), not the segment's end; the report's
    events put the ``Failed`` right after that failure's handler call, before later failures'."""
    stats = LoaderStats()
    stats.error_handler = lambda *args: None
    chain = FailureChain()

    def run(failures, success_first, success_last):
        r = StageRun(stage="encode_sample", tolerance=3)
        if success_first:
            r.success()
        for at in failures:
            r.defer(ValueError(f"bad {at}"), at, [], at=at, seq=at)
            r.failure(f"bad {at}", at=at, seq=at)
        if success_last:
            r.success()
        return r

    assert stats.account(rows.Report(0, 0, 0, 0, 0, [run([9], True, False)]), chain)[0][1] == 9
    second = run([10, 11], False, True)
    second.failure("bad 14", at=14, seq=14)
    fatal = FailureChain()
    fatal._runs[(0, "encode_sample")] = 1
    found = fatal.check(0, second)
    assert found is not None and (found.at, found.seq) == (11, 11.5)
    assert found.message.startswith("3 consecutive failures in stage 'encode_sample' of worker stream 0")
    assert found.message.endswith("last: bad 11")
    events = stats.account(rows.Report(0, 1, 0, 0, 0, [second]), chain)
    kinds = [(at, type(event).__name__) for _, at, event in events]
    assert kinds == [(10, "HandlerCall"), (11, "HandlerCall"), (11, "Failed")]
    assert str(events[-1][2].error).endswith("last: bad 11")


def test_seam_batches_made_again_after_a_restore_are_counted_once():
    """A seam task reached before Ray lost the execution (its batches partly consumed) is made again
    from the restored checkpoint: its skip, its batches and its failure run count once, not twice."""
    failed = rows.Report(0, -1, 0, 0, 2, [StageRun(stage="batch", tolerance=5, trail=1, had_success=True, failures=1)])

    def seam(worker, groups):  # as ``seam_items``: the third group's batch fails
        def resolve():
            for _, _, event in q.stats.account(failed, q.chain):
                q.stats.run_event(event)
            pending.reports = [failed]
            return ["+".join(str(x[2]) for x in group) for _, group in groups[:2]]

        pending = Pending(resolve)
        return [pending]

    q = WorkerQueues(1, 2, seam)
    segment = rows.Report(0, 0, 6, 6, 0, [], node="n1")
    leftovers = (rows.LEFTOVER, 0, 0, 0, [(None, 2, [(i, 0, f"s{i}") for i in range(6)])])

    def feed_segment():
        q.feed(leftovers, False, None, q.account(segment))
        q.feed((rows.REPORT, 0, 0, 9, segment), True, None, [])

    feed_segment()
    assert q.pop(0) == "s0+s1"
    assert (q.stats.skipped, q.stats.seam_batches, q.chain.runs_of(0)) == ({"batch": 1}, 2, {(0, "batch"): 1})
    state = q.state(0)
    assert (state.checkpoint.segment, state.consumed) == (0, 1)
    q.restore(0, state, {})
    assert (q.stats.samples_read, q.stats.skipped, q.stats.seam_batches, q.chain.runs_of(0)) == (0, {}, 0, {})
    feed_segment()  # made again
    assert _drain(q, 0) == ["s2+s3"] and q.done[0]
    assert (q.stats.samples_read, q.stats.skipped, q.stats.seam_batches) == (6, {"batch": 1}, 2)
    assert q.chain.runs_of(0) == {(0, "batch"): 1}  # not 2: the seam task's failure once
