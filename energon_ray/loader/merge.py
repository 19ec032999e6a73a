"""Driver-side ordering, without Ray: per-worker item queues and the round-robin over workers.

``WorkerQueues`` takes one source's rows in plan order. Items queue up per logical worker;
leftover samples (a segment lost samples to errors, or a stream ended) and the keyed samples of
grouped batching are pooled per worker and bucket, still serialized, and the groups that fill (or
remain when the stream ends) are handed to ``make_batches``, which starts one Ray task to batch them
(*seam* batches) and queues a ``Pending`` that the queue resolves when the consumer reaches it. ``round_robin`` interleaves
the workers exactly like a torch ``DataLoader`` interleaves its worker processes: a finished (or
capped) worker drops out (``loader.round_robin``); ``loader.stats`` counts what the queues file.
Their save and restore (checkpoints in positions) is ``loader.queue_saving``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from energon_ray.errors import FatalSampleError, ShardReadError
from energon_ray.loader.pinning import handed_out
from energon_ray.loader.chain_points import ChainPoints
from energon_ray.loader.ledger import ReportLedger
from energon_ray.loader.queue_log import QueueLog
from energon_ray.loader.queue_saving import QueueSaving, pool_refs
from energon_ray.loader.stats import Event, Failed, HandlerCall, LoaderStats, report_counts
from energon_ray.pipeline import rows
from energon_ray.pipeline.policy import FailureChain

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

    __slots__ = ("resolve", "positions", "reports")

    def __init__(self, resolve: Callable[[], List[Any]]):
        self.resolve = resolve
        #: set by ``resolve`` where known: the stream positions of each made item's samples
        self.positions: Optional[List[List[int]]] = None
        #: set by ``resolve`` where known: the task's reports it counted (``loader.stats``, the failure runs)
        self.reports: List[rows.Report] = []


class WorkerQueues(QueueSaving):
    """Per-worker queues of one source's items, fed with its rows in plan order.

    Every event that can queue items (a segment's rows, the previous dataset's remainder, the end of
    the stream) first records a ``QueueCheckpoint`` of the worker's pools in positions, and its items
    are tagged with it (``log``: ``queue_log.QueueLog``). A save takes the checkpoint of the oldest
    item not yet consumed and how many of that event's items were; a restore re-reads the pooled
    samples, replays the event and drops those items (see ``state()``/``restore()``).

    Args:
        num_workers: logical worker streams.
        batch_size: samples per batch (``None``: items are samples, nothing to pool).
        make_batches: ``(worker, [(batch size, group), ...]) -> [batches or Pending]`` for pooled groups.
        drop_last: drop each stream's final short batch.
        stats: counters to update.
        leaf: this source's index in the composition (pooled samples remember where they come from).
        hand_out: the rows carry every sample to the pool, which ``pop`` hands out one at a time,
            still serialized (a leaf of a sample blend: the blend draws samples, then batches them);
            a segment's samples become available with its report, and the state is the pool's
            samples and the next segment.
        chained: the segments are chained (``StageConfig.chained``): batches run on from one segment
            into the next inside Ray, and a checkpoint records where a restore rebuilds that
            (``QueueCheckpoint.chain``, from the segments' reports: ``chain_point``).
        index_offsets: per worker, the samples of its stream in the sources before this one (a
            concatenation batched as one stream): a pooled group's batch index counts on over them.
        grouped: the pools are ``batch_group_criterion`` buckets: every batch is made here, and a
            group's batch index (``current_batch_index`` in ``batch``/``encode_batch``) is the number
            of groups the worker's stream made before it, as Energon counts its batches (not its
            first sample's position over the bucket size).
    """

    def __init__(
        self,
        num_workers: int,
        batch_size: Optional[int],
        make_batches: Callable[[int, List[Tuple[int, List[Any]]]], List[Any]],
        *,
        drop_last: bool = False,
        stats: Optional[LoaderStats] = None,
        leaf: int = 0,
        hand_out: bool = False,
        chained: bool = False,
        index_offsets: Optional[Sequence[int]] = None,
        grouped: bool = False,
        chain_unit: Optional[int] = None,
        count_batches: bool = True,
    ):
        self.num_workers = num_workers
        #: leaf → per worker, its samples' offset in the concatenated stream (shared along a chain)
        self.index_offsets: Dict[int, List[int]] = {} if index_offsets is None else {leaf: list(index_offsets)}
        self.chained = chained
        self.grouped = grouped
        #: batches across sources (``index_offsets``) count their index as batches made (else by position)
        self.count_batches = count_batches
        #: per worker (``grouped``, or counted batches across sources): groups made so far (shared
        #: along a concatenation's chain)
        self.groups_made = [0] * num_workers
        #: per worker: whether a restore set ``groups_made`` yet (shared with it): a chain's leaves
        #: restore one after another, and its count goes on from its oldest checkpoint's
        self.counts_restored = [False] * num_workers
        #: per worker (chained): where a restore rebuilds the carry (``QueueCheckpoint.chain``); with
        #: ``chain_unit`` (packs chained: the packing buffer size) reaching back to the oldest pooled pack
        self.chains = ChainPoints(num_workers, chain_unit or batch_size or 1, packs=chain_unit is not None) if chained else None
        self.batch_size = batch_size
        self.make_batches = make_batches
        self.drop_last = drop_last
        self.stats = stats if stats is not None else LoaderStats()
        self.leaf = leaf
        self.hand_out = hand_out
        #: per worker (``hand_out``): the samples of the segment being fed, pooled at its report
        self.staged: List[List[Tuple[Any, int, Any]]] = [[] for _ in range(num_workers)]
        self.queues: List[Deque[Any]] = [deque() for _ in range(num_workers)]
        #: per worker: bucket key → (batch size, pooled ``(position, sub, payload, leaf)``); key None without grouping
        self.pools: List[Dict[Any, Tuple[int, List[Any]]]] = [{} for _ in range(num_workers)]
        self.done = [False] * num_workers
        self.chain = FailureChain()
        #: what each counted segment added, taken back when a restore makes it again
        self.ledger = ReportLedger(num_workers)
        #: the next source of a concatenation batched as one stream: it takes over our remainders
        self.downstream: Optional["WorkerQueues"] = None
        #: per worker: the upstream's remainder has not arrived yet (hold rows' samples, cut nothing)
        self.waiting = [False] * num_workers
        self.held: List[List[Tuple[Any, int, Any]]] = [[] for _ in range(num_workers)]
        #: per worker: the segment being fed (``None`` between segments) and the next one
        self.feeding: List[Optional[int]] = [None] * num_workers
        self.next_segment = [0] * num_workers
        #: save/restore bookkeeping of the queues (positions only)
        self.log = QueueLog(num_workers)

    # -- events ---------------------------------------------------------------------------------
    def chain_to(self, downstream: "WorkerQueues") -> None:
        """Each worker's remainder (its pools) goes to ``downstream``, ahead of its samples, instead of
        being flushed as short batches; ``downstream`` cuts no batch before it has it."""
        self.downstream = downstream
        self.index_offsets.update(downstream.index_offsets)  # carried samples keep their source's offsets
        downstream.index_offsets = self.index_offsets
        downstream.groups_made = self.groups_made  # a grouped stream's batch count runs on
        downstream.counts_restored = self.counts_restored
        downstream.waiting = [True] * downstream.num_workers
        for w in range(self.num_workers):
            if self.done[w]:  # closed before the chain existed (no segments for this worker)
                downstream.carry_in(w, {})

    def carry_in(self, worker: int, pools: Dict[Any, Tuple[int, List[Any]]]) -> None:
        """The upstream's remainder of ``worker``'s stream: its pools, then the samples held here."""
        self._event(worker, "carry", carried=pool_refs(pools))
        self.pools[worker] = pools
        self.waiting[worker] = False
        held, self.held[worker] = self.held[worker], []
        self._pool(worker, held)
        if self.done[worker]:
            self._finish(worker)

    def close_worker(self, worker: int) -> None:
        """The worker's stream has no more segments: flush its pools (each bucket's short batch), or
        hand them on to the next source of a concatenation."""
        self._event(worker, "close")
        self.done[worker] = True
        self.feeding[worker] = None
        if not self.waiting[worker]:  # else: finished when the upstream's remainder arrives
            self._finish(worker)

    def account(self, report: rows.Report) -> List[Event]:
        """Count a segment's report now, before its rows are fed (``LoaderStats.account``): the
        handler calls and fatal errors it asks for, for ``events.place_events`` (``feed(events=...)``).
        What it added is noted (``ledger``), so a restore that makes the segment again takes it back."""
        worker = report.worker
        runs_before = self.chain.runs_of(worker)
        events = self.stats.account(report, self.chain)
        self.ledger.note(worker, report.segment, report_counts(report), runs_before)
        self.ledger.forget_before(worker, self._checkpoint_segment(worker))
        return events

    def feed(self, row: Row, last_segment: bool, positions: Optional[List[int]] = None, events: Optional[List[Any]] = None) -> None:
        """Take one row (in plan order). ``last_segment``: its segment ends the worker's stream;
        ``positions``: an item's samples' stream positions. ``events``: the segment's report was
        counted already (``account``): the ``HandlerCall``/``Failed`` events to queue before this row
        (``events.place_events``; with ``hand_out``, all at the report, done as it is fed); ``None``: the
        report is counted as it is fed, its events done at once."""
        kind, worker, segment, _, payload = row
        if self.feeding[worker] != segment:
            self.next_segment[worker] = segment
            self._event(worker, "feed")
            self.feeding[worker] = segment
        if events:
            if self.hand_out:  # samples handed out from the pool: no queue to hold them
                for event in events:
                    self.stats.run_event(event)
            else:
                self._put(worker, list(events))
        if kind == rows.ITEM:
            self.queues[worker].append(payload)
            self.log.queued(worker, [positions or []])
        elif kind == rows.LEFTOVER:
            entries = [(key, size, (*item, self.leaf)) for key, size, items in payload for item in items]
            if self.chains is not None:
                self.chains.pack_made(worker, segment, ((item[0], item[1]) for _, _, item in entries))
            if self.hand_out:
                self.staged[worker].extend(entries)
            else:
                self._pool(worker, entries)
        elif kind == rows.REPORT:
            try:
                if events is None:
                    for _, _, event in self.account(payload):
                        self.stats.run_event(event)
            except (FatalSampleError, ShardReadError) as exc:
                if self.hand_out:  # samples handed out from the pool: no queue to hold it
                    raise
                self._put(worker, [Failed(exc)])
            if self.chains is not None and payload.outputs_before is not None:
                entry = (segment, payload.outputs_before, payload.samples_encoded, payload.tail_from, getattr(payload, "counts", None))
                self.chains.reported(worker, entry, self._pooled(worker))
            if self.hand_out:
                staged, self.staged[worker] = self.staged[worker], []
                self.pools[worker].setdefault(None, (0, []))[1].extend(item for _, _, item in staged)
            self.feeding[worker] = None
            self.next_segment[worker] = segment + 1
            if last_segment:
                self.close_worker(worker)
        else:
            raise RuntimeError(f"unexpected row kind {kind} from worker {worker}, segment {segment}")

    def _finish(self, worker: int) -> None:
        if self.hand_out:  # the pool is handed out to its end
            return
        pools, self.pools[worker] = self.pools[worker], {}
        if self.downstream is not None:
            self.downstream.carry_in(worker, pools)
        elif not self.drop_last:
            short = [self._group(worker, limit, items) for limit, items in pools.values() if items]
            if short:
                self._put(worker, self.make_batches(worker, short))

    def _pool(self, worker: int, entries: List[Tuple[Any, int, Any]]) -> None:
        """Pool ``(bucket key, bucket size, (position, sub, payload, leaf))`` in stream order; the
        groups that fill go to ``make_batches`` (one Ray task), in the order they filled."""
        if self.waiting[worker]:
            self.held[worker].extend(entries)
            return
        full = []
        pools = self.pools[worker]
        for key, size, item in entries:
            limit, pool = pools.setdefault(key, (size, []))
            pool.append(item)
            if len(pool) >= limit:
                full.append(self._group(worker, limit, pool[:limit]))
                del pool[:limit]
        if full:
            self._put(worker, self.make_batches(worker, full))

    def _group(self, worker: int, limit: int, items: List[Any]) -> Tuple[Any, ...]:
        """``(batch size, samples)`` for ``make_batches``, plus the batch's index in the worker's
        concatenated stream where sources are batched as one (its first sample's position there), or
        of grouped batching (the groups the stream made before it)."""
        if self.grouped:
            index, self.groups_made[worker] = self.groups_made[worker], self.groups_made[worker] + 1
            return (limit, _strip(items), index)
        if not self.index_offsets:
            return (limit, _strip(items))
        if self.count_batches:  # Energon's count of batches made, also after skipped samples
            index, self.groups_made[worker] = self.groups_made[worker], self.groups_made[worker] + 1
            return (limit, _strip(items), index)
        position, _, _, leaf = items[0]
        return (limit, _strip(items), (self.index_offsets[leaf][worker] + int(position)) // limit)

    def _put(self, worker: int, items: List[Any]) -> None:
        self.queues[worker].extend(items)
        self.log.queued(worker, [[] for _ in items])

    # -- consumption ----------------------------------------------------------------------------
    def pop(self, worker: int) -> Any:
        """The worker's next item (resolving seam batches), or ``NOTHING`` if none is queued; with
        ``hand_out``, the next pooled ``(position, sub, payload, leaf)``."""
        if self.hand_out:
            pool = self.pools[worker].get(None)
            return pool[1].pop(0) if pool and pool[1] else NOTHING
        queue, log = self.queues[worker], self.log
        while queue:
            if type(queue[0]) is Failed:  # left queued: the stream raises again if asked again
                error = queue[0].error
                raise type(error)(str(error))
            item, (tag, span) = queue.popleft(), log.take(worker)
            if type(item) is HandlerCall:
                if not log.skip[worker]:  # (else: called before the state this queue was restored from)
                    self.stats.run_event(item)  # a handler that raises stops the stream here
                continue
            if type(item) is Pending:
                made = self._resolve(worker, item, tag)
                queue.extendleft(reversed(made))
                log.put_back(worker, tag, item.positions or [[] for _ in made])
                continue
            if log.skip[worker]:  # consumed before the state this queue was restored from
                log.skip[worker] -= 1
                continue
            log.consumed(worker, tag, span)
            return handed_out(item)
        return NOTHING

    def _resolve(self, worker: int, pending: Pending, tag: int) -> List[Any]:
        """A seam task's items (with the handler calls and fatal errors of its task among them), its
        batches counted; what it added is noted under its event's checkpoint segment (``ledger``): a
        restore to that segment or before queues, makes and counts it again."""
        runs_before = self.chain.runs_of(worker)
        made = pending.resolve()
        batches = sum(1 for m in made if type(m) not in (HandlerCall, Failed))
        self.stats.seam_batches += batches
        counts = [report_counts(report) for report in pending.reports]
        checkpoint = self.log.checkpoint_of(worker, tag)
        segment = checkpoint.segment if checkpoint is not None else self.next_segment[worker]
        self.ledger.note_seams(worker, segment, counts, runs_before, batches)
        return made


def _strip(items: List[Any]) -> List[Tuple[int, int, Any]]:
    """Pooled ``(position, sub, payload, leaf)`` → the ``(position, sub, payload)`` a seam batch takes."""
    return [(position, sub, payload) for position, sub, payload, _ in items]
