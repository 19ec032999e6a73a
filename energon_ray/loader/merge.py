"""Driver-side ordering, without Ray: per-worker item queues and the round-robin over workers.

``WorkerQueues`` takes one source's rows in plan order. Items queue up per logical worker;
leftover samples (a segment lost samples to errors, or a stream ended) and the keyed samples of
grouped batching are pooled per worker and bucket, still serialized, and the groups that fill (or
remain when the stream ends) are handed to ``make_batches``, which starts one Ray task to batch them
(*seam* batches) and queues a ``Pending`` that the queue resolves when the consumer reaches it. ``round_robin`` interleaves
the workers exactly like a torch ``DataLoader`` interleaves its worker processes: a finished (or
capped) worker drops out.
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

#: What a provider returns when a worker's stream has nothing more.
EXHAUSTED = object()
#: What ``WorkerQueues.pop`` returns when nothing is queued (yet) for a worker.
NOTHING = object()


class Pending:
    """Queued items that are still being made (a seam batch in a Ray task).

    Args:
        resolve: returns the finished items (0, 1 or more), waiting for them if needed.
    """

    __slots__ = ("resolve",)

    def __init__(self, resolve: Callable[[], List[Any]]):
        self.resolve = resolve


class LoaderStats:
    """Counters the user can read while iterating (``loader.stats``)."""

    def __init__(self) -> None:
        self.samples_read = 0
        self.samples_encoded = 0
        self.batches = 0
        self.seam_batches = 0
        self.skipped: Dict[str, int] = {}
        self.ignored: Dict[str, int] = {}
        #: segments made per Ray node id
        self.segments_per_node: Dict[str, int] = {}

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> Dict[str, Any]:
        return {
            "samples_read": self.samples_read,
            "samples_encoded": self.samples_encoded,
            "batches": self.batches,
            "seam_batches": self.seam_batches,
            "skipped": dict(self.skipped),
            "ignored": dict(self.ignored),
            "segments_per_node": dict(self.segments_per_node),
        }

    def __repr__(self) -> str:
        return f"LoaderStats({self.as_dict()})"

    def add_report(self, report: rows.Report, chain: FailureChain) -> None:
        """Count a segment's report, log its skips, and raise its fatal error (in plan order)."""
        self.samples_read += report.samples_read
        self.samples_encoded += report.samples_encoded
        if report.node is not None:
            self.segments_per_node[report.node] = self.segments_per_node.get(report.node, 0) + 1
        for run in report.runs:
            if run.failures:
                self.skipped[run.stage] = self.skipped.get(run.stage, 0) + run.failures
                for message in run.messages:
                    logger.warning("skipped (%s): %s", run.stage, message)
                if run.failures > len(run.messages):
                    logger.warning(
                        "skipped (%s): %d more in segment %d of worker %d",
                        run.stage, run.failures - len(run.messages), report.segment, report.worker,
                    )  # fmt: skip
            if run.ignored:
                self.ignored[run.stage] = self.ignored.get(run.stage, 0) + run.ignored
            chain.add(report.worker, run)
        if report.fatal is not None:
            kind, message = report.fatal
            raise (ShardReadError if kind == "ShardReadError" else FatalSampleError)(message)


class WorkerQueues:
    """Per-worker queues of one source's items, fed with its rows in plan order.

    Args:
        num_workers: logical worker streams.
        batch_size: samples per batch (``None``: items are samples, nothing to pool).
        make_batches: ``(worker, [(batch size, group), ...]) -> [batches or Pending]`` for pooled groups.
        drop_last: drop each stream's final short batch.
        stats: counters to update.
    """

    def __init__(
        self,
        num_workers: int,
        batch_size: Optional[int],
        make_batches: Callable[[int, List[Tuple[int, List[Any]]]], List[Any]],
        *,
        drop_last: bool = False,
        stats: Optional[LoaderStats] = None,
    ):
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.make_batches = make_batches
        self.drop_last = drop_last
        self.stats = stats if stats is not None else LoaderStats()
        self.queues: List[Deque[Any]] = [deque() for _ in range(num_workers)]
        #: per worker: bucket key → (batch size, pooled samples); key None without grouping
        self.pools: List[Dict[Any, Tuple[int, List[Any]]]] = [{} for _ in range(num_workers)]
        self.done = [False] * num_workers
        self.chain = FailureChain()
        #: the next source of a concatenation batched as one stream: it takes over our remainders
        self.downstream: Optional["WorkerQueues"] = None
        #: per worker: the upstream's remainder has not arrived yet (hold rows' samples, cut nothing)
        self.waiting = [False] * num_workers
        self.held: List[List[Tuple[Any, int, Any]]] = [[] for _ in range(num_workers)]

    def chain_to(self, downstream: "WorkerQueues") -> None:
        """Each worker's remainder (its pools) goes to ``downstream``, ahead of its samples, instead of
        being flushed as short batches; ``downstream`` cuts no batch before it has it."""
        self.downstream = downstream
        downstream.waiting = [True] * downstream.num_workers
        for w in range(self.num_workers):
            if self.done[w]:  # closed before the chain existed (no segments for this worker)
                downstream.carry_in(w, {})

    def carry_in(self, worker: int, pools: Dict[Any, Tuple[int, List[Any]]]) -> None:
        """The upstream's remainder of ``worker``'s stream: its pools, then the samples held here."""
        self.pools[worker] = pools
        self.waiting[worker] = False
        held, self.held[worker] = self.held[worker], []
        self._pool(worker, held)
        if self.done[worker]:
            self._finish(worker)

    def close_worker(self, worker: int) -> None:
        """The worker's stream has no more segments: flush its pools (each bucket's short batch), or
        hand them on to the next source of a concatenation."""
        self.done[worker] = True
        if not self.waiting[worker]:  # else: finished when the upstream's remainder arrives
            self._finish(worker)

    def _finish(self, worker: int) -> None:
        pools, self.pools[worker] = self.pools[worker], {}
        if self.downstream is not None:
            self.downstream.carry_in(worker, pools)
        elif not self.drop_last:
            short = [(limit, items) for limit, items in pools.values() if items]
            if short:
                self.queues[worker].extend(self.make_batches(worker, short))

    def _pool(self, worker: int, entries: List[Tuple[Any, int, Any]]) -> None:
        """Pool ``(bucket key, bucket size, sample)`` in stream order; the groups that fill go to
        ``make_batches`` (one Ray task), in the order they filled."""
        if self.waiting[worker]:
            self.held[worker].extend(entries)
            return
        full = []
        pools = self.pools[worker]
        for key, size, item in entries:
            limit, pool = pools.setdefault(key, (size, []))
            pool.append(item)
            if len(pool) >= limit:
                full.append((limit, pool[:limit]))
                del pool[:limit]
        if full:
            self.queues[worker].extend(self.make_batches(worker, full))

    def pop(self, worker: int) -> Any:
        """The worker's next item (resolving seam batches), or ``NOTHING`` if none is queued."""
        queue = self.queues[worker]
        while queue:
            item = queue.popleft()
            if type(item) is not Pending:
                return item
            made = item.resolve()
            self.stats.seam_batches += len(made)
            queue.extendleft(reversed(made))
        return NOTHING

    def feed(self, row: Row, last_segment: bool) -> None:
        """Take one row (in plan order). ``last_segment``: its segment ends the worker's stream."""
        kind, worker, segment, _, payload = row
        if kind == rows.ITEM:
            self.queues[worker].append(payload)
        elif kind == rows.LEFTOVER:
            self._pool(worker, [(key, size, item) for key, size, items in payload for item in items])
        elif kind == rows.REPORT:
            self.stats.add_report(payload, self.chain)
            if last_segment:
                self.close_worker(worker)
        else:
            raise RuntimeError(f"unexpected row kind {kind} from worker {worker}, segment {segment}")


def round_robin(
    num_workers: int,
    next_item: Callable[[int], Any],
    *,
    caps: Optional[Sequence[int]] = None,
    start_worker: int = 0,
    stats: Optional[LoaderStats] = None,
) -> Iterator[Any]:
    """Interleave workers item by item; ``next_item(w)`` returns an item or ``EXHAUSTED``.

    Example:
        >>> streams = {0: iter("ab"), 1: iter("x")}
        >>> list(round_robin(2, lambda w: next(streams[w], EXHAUSTED)))
        ['a', 'x', 'b']
    """
    active = [True] * num_workers
    emitted = [0] * num_workers
    w = start_worker % max(1, num_workers)
    while any(active):
        if active[w] and caps is not None and emitted[w] >= caps[w]:
            active[w] = False
        if active[w]:
            item = next_item(w)
            if item is EXHAUSTED:
                active[w] = False
            else:
                emitted[w] += 1
                if stats is not None:
                    stats.batches += 1
                yield item
        w = (w + 1) % num_workers
