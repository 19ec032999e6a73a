"""Turns the plan-ordered rows of Ray into the loader's batch sequence (driver side, no Ray).

Items of each worker stream queue up in order; leftover samples (a segment lost samples to errors,
or the stream ended) are pooled per stream and batched here once ``batch_size`` of them are
gathered (or the stream ends). Streams are then interleaved round-robin, exactly like a torch
``DataLoader`` interleaves its workers: a finished stream drops out, a capped one (``limit``) too.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from energon_ray.errors import FatalSampleError, ShardReadError
from energon_ray.pipeline import rows
from energon_ray.pipeline.policy import FailureChain

logger = logging.getLogger("energon_ray")

Row = Tuple[int, int, int, int, Any]


class LoaderStats:
    """Counters the user can read while iterating (``loader.stats``)."""

    def __init__(self) -> None:
        self.samples_read = 0
        self.samples_encoded = 0
        self.batches = 0
        self.driver_batches = 0
        self.skipped: Dict[str, int] = {}
        self.ignored: Dict[str, int] = {}

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> Dict[str, Any]:
        return {
            "samples_read": self.samples_read,
            "samples_encoded": self.samples_encoded,
            "batches": self.batches,
            "batches_built_in_driver": self.driver_batches,
            "skipped": dict(self.skipped),
            "ignored": dict(self.ignored),
        }

    def __repr__(self) -> str:
        return f"LoaderStats({self.as_dict()})"


class StreamMerger:
    """Round-robin merge of worker streams with leftover pooling.

    Args:
        num_workers: number of worker streams.
        finite: which streams end (their last segment's report closes them).
        batch_size: samples per batch (``None``: items are samples, nothing to pool).
        make_batches: ``(worker, group) -> [batches]`` for pooled groups (runs in the driver).
        drop_last: drop each stream's final short batch.
        caps: optional maximum number of items per stream (``limit``).
        stats: counters to update.
        start_worker: the worker whose item comes first.
    """

    def __init__(
        self,
        num_workers: int,
        batch_size: Optional[int],
        make_batches: Callable[[int, List[Any]], List[Any]],
        *,
        drop_last: bool = False,
        caps: Optional[Sequence[int]] = None,
        stats: Optional[LoaderStats] = None,
        start_worker: int = 0,
    ):
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.make_batches = make_batches
        self.drop_last = drop_last
        self.caps = list(caps) if caps is not None else None
        self.stats = stats or LoaderStats()
        self.queues: List[Deque[Any]] = [deque() for _ in range(num_workers)]
        self.pools: List[List[Any]] = [[] for _ in range(num_workers)]
        self.done = [False] * num_workers
        self.emitted = [0] * num_workers
        self.next_worker = start_worker % max(1, num_workers)
        self.chain = FailureChain()

    def close_worker(self, worker: int) -> None:
        """The stream has no more segments: flush its pool."""
        pool = self.pools[worker]
        if pool and not self.drop_last:
            self._driver_batches(worker, pool)
        self.pools[worker] = []
        self.done[worker] = True

    def _driver_batches(self, worker: int, group: List[Any]) -> None:
        made = self.make_batches(worker, group)
        self.stats.driver_batches += len(made)
        self.queues[worker].extend(made)

    def feed(self, row: Row, last_segment: bool) -> None:
        """Take one row (in plan order). ``last_segment`` says whether its segment ends the stream."""
        kind, worker, segment, _, payload = row
        if kind == rows.ITEM:
            self.queues[worker].append(payload)
        elif kind == rows.LEFTOVER:
            pool = self.pools[worker]
            pool.extend(payload)
            size = self.batch_size or 1
            while len(pool) >= size:
                group, self.pools[worker] = pool[:size], pool[size:]
                pool = self.pools[worker]
                self._driver_batches(worker, group)
        elif kind == rows.REPORT:
            self._report(payload)
            if last_segment:
                self.close_worker(worker)
        else:
            raise RuntimeError(f"unexpected row kind {kind} from worker {worker}, segment {segment}")

    def _report(self, report: rows.Report) -> None:
        stats = self.stats
        stats.samples_read += report.samples_read
        stats.samples_encoded += report.samples_encoded
        for run in report.runs:
            if run.failures:
                stats.skipped[run.stage] = stats.skipped.get(run.stage, 0) + run.failures
                for message in run.messages:
                    logger.warning("skipped (%s): %s", run.stage, message)
                if run.failures > len(run.messages):
                    logger.warning(
                        "skipped (%s): %d more in segment %d of worker %d",
                        run.stage, run.failures - len(run.messages), report.segment, report.worker,
                    )  # fmt: skip
            if run.ignored:
                stats.ignored[run.stage] = stats.ignored.get(run.stage, 0) + run.ignored
            self.chain.add(report.worker, run)
        if report.fatal is not None:
            kind, message = report.fatal
            raise (ShardReadError if kind == "ShardReadError" else FatalSampleError)(message)

    def _capped(self, worker: int) -> bool:
        return self.caps is not None and self.emitted[worker] >= self.caps[worker]

    def finished(self) -> bool:
        """No stream can yield anything more."""
        return all(self._capped(w) or (self.done[w] and not self.queues[w]) for w in range(self.num_workers))

    def pop(self) -> Tuple[str, Any]:
        """``("item", x)`` for the next item, ``("need", None)`` if more rows are needed, or
        ``("end", None)`` when every stream is finished."""
        for _ in range(self.num_workers):
            w = self.next_worker
            if self._capped(w) or (self.done[w] and not self.queues[w]):
                self.next_worker = (w + 1) % self.num_workers
                continue
            if not self.queues[w]:
                return "need", None
            self.next_worker = (w + 1) % self.num_workers
            self.emitted[w] += 1
            self.stats.batches += 1
            return "item", self.queues[w].popleft()
        return "end", None


def merge(
    merger: StreamMerger, source: Iterator[Tuple[Row, bool]]
) -> Iterator[Any]:
    """Drive a merger from a row iterator; yields items in loader order."""
    while True:
        state, item = merger.pop()
        if state == "item":
            yield item
        elif state == "end":
            return
        else:
            try:
                row, last = next(source)
            except StopIteration:
                for w in range(merger.num_workers):
                    if not merger.done[w]:
                        merger.close_worker(w)
                # flushes may have produced items; drain them, then stop
                while True:
                    state, item = merger.pop()
                    if state != "item":
                        return
                    yield item
            merger.feed(row, last)
