"""Feeds: the leaf datasets' worker streams for one pass, produced by ONE stream of Ray tasks.

``MultiFeed`` hands Ray the segments of all leaves in one task list, ordered by when the loader is
expected to need them (``plan.schedule``), submits it window by window (plain tasks by default, one
Ray Data execution per window with ``executor="ray_data"``), and files each row of the
output blocks into its leaf's per-worker queues. Per batch the trainer only maps a block from the
object store and unpickles a few hundred bytes of metadata: tensors are views of the shared memory
(``serde.loads(copy=False)``), and on CUDA each batch is copied once into pinned memory (``loader.pinning``).
``LeafFeed.next_item(worker)`` pulls rows until that worker of that leaf has an item, so the
composition decides the order and Ray only makes the items. One execution for all sources keeps
the driver's overhead that of a single source. How a block's rows are checked, decoded and
pinned ahead is ``loader.block_rows``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple


from energon_ray.errors import ExecutionLost
from energon_ray.loader.block_rows import BlockRows
from energon_ray.loader.leaf_feed import LeafFeed
from energon_ray.loader.merge import Row
from energon_ray.loader.stats import LoaderStats
from energon_ray.loader.pinning import Pinner
from energon_ray.loader.restore import restore_reads, restore_streams, run_reads
from energon_ray.loader.state import StreamState
from energon_ray.pipeline.located import BlockRefs
from energon_ray.plan.schedule import LeafSchedule, NeedFn, windows

logger = logging.getLogger("energon_ray")

#: Most segments (Ray read tasks) one Ray Dataset execution holds. Larger windows cost the driver
#: more (Ray Data's scheduling loop over thousands of pending tasks measured 2x the driver CPU).
MAX_WINDOW_SEGMENTS = 512
#: Segments of the first window, started when the loader is built; later windows grow 4x. (4 was
#: measured too: slower first batches on 2 cores.)
FIRST_WINDOW_SEGMENTS = 64
#: Restarts of a lost execution (feeder actor, node) within one pass before the loader gives up.
MAX_RECOVERIES = 3

#: how a pass's segments are executed (``MultiFeed.start``); the first is the default
EXECUTORS = ("tasks", "ray_data")


def check_executor(executor: Optional[str], name: str = "executor") -> str:
    """``executor`` checked (an error names it ``name``); ``None``: ``$ENERGON_RAY_EXECUTOR`` or the default, ``"tasks"``."""
    if executor is None:
        executor = os.environ.get("ENERGON_RAY_EXECUTOR", "").strip() or EXECUTORS[0]
        name = f"ENERGON_RAY_EXECUTOR (what an unset {name} means)"
    if executor not in EXECUTORS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, EXECUTORS))}, not {executor!r}")
    return executor


class MultiFeed(BlockRows):
    """All leaves of a composition for one pass: one stream of segment tasks (or, with the Ray Data
    executor, one Ray Dataset execution per window).

    Args:
        leaves: the leaf datasets, in the composition's order.
        shares: ``(share, offset)`` of each leaf (see ``plan.schedule``).
        needs: exact ``need(worker, item)`` per leaf where the composition knows it.
        pass_index: epoch of the pass (later ``repeat=False`` passes reshuffle).
        pin: pin batches (CUDA only).
        stats: loader counters.
        prefetch_batches: blocks Ray prefetches.
        ray_remote_args: resources per segment task.
        object_store_limit: bytes of finished blocks an execution may hold ahead of the trainer.
        executor: ``"tasks"`` (plain Ray tasks) or ``"ray_data"`` (the feeder's Ray Data executions);
            see ``start``.
        on_execute: called with each ``BlockStream`` or ``TaskStream`` when its execution starts.
        starts: first segment of each leaf's worker streams (a restored pass).
        restored: the loader state this pass restores (kept to recognise an early start).
        plan_for: ``(leaf, index) -> SegmentPlan`` instead of the leaf's own plan (redistributed pass).
    """

    def __init__(
        self,
        leaves: Sequence[Any],
        shares: Sequence[Tuple[float, float]],
        pass_index: int,
        needs: Optional[Sequence[Optional[NeedFn]]] = None,
        *,
        pin: bool,
        stats: LoaderStats,
        prefetch_batches: int = 4,
        ray_remote_args: Optional[dict] = None,
        object_store_limit: Optional[int] = None,
        executor: Optional[str] = None,
        on_execute: Optional[Callable[[Any], None]] = None,
        starts: Optional[Sequence[Sequence[int]]] = None,
        restored: Any = None,
        plan_for: Optional[Callable[[Any, int], Any]] = None,
    ):
        self.leaves = list(leaves)
        self.pass_index = pass_index
        #: the loader state this pass was restored from (None: a pass from its start)
        self.restored = restored
        self.prefetch_batches = prefetch_batches
        self.ray_remote_args = ray_remote_args
        self.on_execute = on_execute
        self.pin = pin
        self._pinner = Pinner() if pin else None
        #: where the pooled samples of a sample blend's leaves lie (``located.BlockRefs``)
        self.block_refs = BlockRefs()
        self.stats = stats
        self._batches_before = stats.batches
        self.feeds: List[LeafFeed] = []
        self.schedules: List[LeafSchedule] = []
        needs = list(needs) if needs is not None else [None] * len(self.leaves)
        for i, (leaf, (share, offset), need) in enumerate(zip(self.leaves, shares, needs)):
            plan = leaf.plan(pass_index, source=i) if plan_for is None else plan_for(leaf, i)
            self.feeds.append(LeafFeed(self, leaf, plan, pin, stats, source=i))
            # a sample blend's leaf gives samples, which the blend batches
            per_item = 1 if leaf.options.blend_samples else leaf.options.batch_size or 1
            first = None if starts is None else tuple(starts[i])
            self.schedules.append(
                LeafSchedule(plan=plan, share=share, offset=offset, positions_per_item=per_item, need=need, starts=first)
            )
        self._rows: Optional[Iterator[Tuple[int, Row, bool, Optional[List[int]], Optional[List[Any]]]]] = None
        #: rows of the block being read not filed yet; blocks wanted read ahead (one per worker stream
        #: whose queue ran empty; any block read counts); what went wrong reading ahead (raised by the
        #: next ``pull``, where it would have been raised without looking ahead)
        self._rows_left = 0
        self.ahead_wanted = 0
        self._failed_ahead: Optional[BaseException] = None
        #: ``(segments, BlockStream | TaskStream)`` of the window being executed
        self._current: Optional[Tuple[List[Any], Any]] = None
        #: ``[the next window's (segments, stream) or None]`` once started before the current one ended
        self._following: Optional[List[Any]] = None
        self.object_store_limit = object_store_limit
        self.executor = check_executor(executor)
        chained = [leaf for leaf in self.leaves if leaf.stage_config().chained]
        if chained and self.executor == "ray_data":
            logger.warning(
                "energon_ray: executor='ray_data' cannot chain segments (packing buffers, a generator encode_sample "
                "or a restore_seeds batch hook of %s); running this pass as plain Ray tasks", type(chained[0].task_encoder).__name__,
            )  # fmt: skip
            self.executor = "tasks"
        self.endless = any(s.plan.num_rounds is None for s in self.schedules)
        self._readers = {i: leaf.reader() for i, leaf in enumerate(self.leaves)}
        self._configs = {i: leaf.stage_config() for i, leaf in enumerate(self.leaves)}
        self._name = self.leaves[0].operator_name if len(self.leaves) == 1 else "EnergonSegments"
        self._windows = iter(windows(self.schedules, MAX_WINDOW_SEGMENTS, first=FIRST_WINDOW_SEGMENTS))
        self._recoveries = 0
        #: chained leaves: where each restored worker stream rebuilds its carry (``QueueCheckpoint.chain``)
        self._chain_starts: Dict[Tuple[int, int], Tuple[int, ...]] = {}
        if restored is not None:  # (from another world size: the new streams' states, chains afresh)
            self._set_chain_starts(restored.streams)

    def reread(self, streams: Sequence[Sequence[StreamState]]) -> Dict[Tuple[int, int, int, int], Any]:
        """The serialized samples (or packs) a restored state's pools hold, re-made by Ray tasks, by
        ``(worker, leaf, position, sub)``.

        Raises:
            StateError: a sample could not be made again (the dataset changed since the save).
        """
        specs = restore_reads(self.leaves, [s.plan for s in self.schedules], streams)
        found = run_reads(specs, self._readers, self._configs, self.ray_remote_args, self.leaves)
        return {(worker, source, position, sub): value for (source, worker, position, sub), value in found.items()}

    def pull(self) -> None:
        """Take one row from Ray and file it with its leaf (restarting a lost execution)."""
        if self._failed_ahead is not None:
            failed, self._failed_ahead = self._failed_ahead, None
            raise failed
        while True:
            if self._rows is None:
                self.start()
            try:
                source, row, last, positions, events = next(self._rows)
            except StopIteration:
                for feed in self.feeds:
                    feed.close_open_workers()
                return
            except ExecutionLost as exc:
                while True:  # a restart can be lost too (the node is still going down)
                    try:
                        self._recover(exc)
                        break
                    except ExecutionLost as again:
                        exc = again
                continue
            self.feeds[source].queues.feed(row, last, positions, events)
            return

    def pull_ahead(self) -> None:
        """File the rest of the block being read and, if Ray has finished the pass's next block (taking
        it waits for nothing), its first row: the block's batches are then chained for pinning a round
        before the trainer reaches them (``pinning.chained``), not copied on the spot when it does
        (with 4 batches a block, every 4th step waited for that copy). The rows are filed as ``pull``
        files them; an error met here is raised by the next ``pull``, where it would have been. A
        block not finished yet is tried for again at the next call (``ahead_wanted``)."""
        if self._rows is None or self._failed_ahead is not None:
            self.ahead_wanted = 0
            return
        try:
            while self.ahead_wanted > 0:
                while self._rows_left > 0:
                    self.pull()
                stream = self._current[1] if self._current is not None else None
                if stream is None or not stream.ready():
                    return
                self.pull()  # reads the block (``_execute`` counts it off ``ahead_wanted``)
        except Exception as exc:
            self._failed_ahead = exc
            self.ahead_wanted = 0

    def _recover(self, exc: ExecutionLost) -> None:
        """Start the execution again where every worker stream's queue stands (its checkpoint), as a
        restore does; what was consumed is dropped again, nothing is lost or repeated."""
        self._recoveries += 1
        if self._recoveries > MAX_RECOVERIES:
            raise RuntimeError(f"{exc}; gave up after restarting it {MAX_RECOVERIES} times") from None
        logger.warning("%s; restarting it from the worker streams' checkpoints (%d/%d)", exc, self._recoveries, MAX_RECOVERIES)
        workers = range(len(self.schedules[0].plan.streams)) if self.schedules else range(0)
        states = [[feed.queues.state(w) for w in workers] for feed in self.feeds]
        self.close()
        self.schedules = [
            dataclasses.replace(schedule, starts=tuple(s.checkpoint.segment for s in per_worker))
            for schedule, per_worker in zip(self.schedules, states)
        ]
        self._windows = iter(windows(self.schedules, MAX_WINDOW_SEGMENTS, first=FIRST_WINDOW_SEGMENTS))
        self._set_chain_starts(states)
        restore_streams(self.feeds, states, self.reread)

    @property
    def pinner(self) -> Optional[Pinner]:
        """Copies batches into pinned memory off the training thread (``None``: no pinning)."""
        return self._pinner

    def close(self) -> None:
        """Stop the Ray execution."""
        if self._rows is not None:
            self._rows.close()
            self._rows = None
        self._rows_left = 0
        for current in (self._current, *(self._following or ())):
            if current is not None:
                current[1].close()
        self._current = self._following = None
        if self._pinner is not None:
            self._pinner.close()

    def start(self) -> None:
        """Start the pass's execution now (before anyone iterates: a head start).

        ``executor="tasks"`` (the default): every segment, window after window, is a plain Ray task
        of one ``TaskStream``. ``executor="ray_data"``: each window is a Ray Data execution in the
        feeder actor; the first window's first segments run as plain tasks (unless
        ``ENERGON_RAY_START_WITH_TASKS=0``: only warm workers needed, no feeder, Ray Data actors or
        planning), and the feeder's execution of the rest starts once their first block has arrived.
        """
        if self._rows is not None:
            return
        if self.executor == "tasks":
            from energon_ray.pipeline.streams import TaskStream

            self._current = (None, TaskStream(
                self._counted(itertools.chain.from_iterable(self._windows)), self._readers, self._configs,
                ray_remote_args=self.ray_remote_args, object_store_limit=self.object_store_limit,
                before_first=self.before_first_batch, **self._chaining(),
            ))  # fmt: skip
            if self.on_execute is not None:
                self.on_execute(self._current[1])
        else:
            from energon_ray.pipeline.data_stream import task_segments

            window = next(self._windows, None)
            direct = task_segments(len(window)) if window is not None else 0
            if direct:
                self._windows = itertools.chain([window[direct:]], self._windows)
                self._current = self._open(window[:direct], tasks=True)
            else:
                self._current = self._open(window)
        self._rows = self._row_stream()

    def _set_chain_starts(self, streams: Sequence[Sequence[StreamState]]) -> None:
        self._chain_starts = {
            # (the counts before the segment the pass resumes at: a chained packed stream's four packing
            # hook counts where its chain has 11 items, else the batch counts, if any)
            (source, worker): (int(s.checkpoint.chain[0]), int(s.checkpoint.chain[1]),
                               *(int(c) for c in s.checkpoint.chain[3 : 7 if len(s.checkpoint.chain) == 11 else 5]))
            for source, per_worker in enumerate(streams) for worker, s in enumerate(per_worker)
            if s.checkpoint.chain is not None
        }  # fmt: skip

    def _chaining(self) -> Dict[str, Any]:
        """``TaskStream``'s view of chained leaves: where a restored worker stream rebuilds its carry
        (known before the queues are restored: the pass starts first), and those segments' specs;
        and of the leaves whose short segments run several to a task (``EnergonDataset.task_samples``)."""
        targets = {i: getattr(leaf, "task_samples", None) for i, leaf in enumerate(self.leaves)}
        grouped = {i: t for i, t in targets.items() if t is not None}
        return {
            "chain_start": lambda source, worker: self._chain_starts.get((source, worker)),
            "segment_spec": lambda source, worker, index: self.schedules[source].plan.segment(worker, index),
            "group": max(grouped.values()) if grouped else None,
            "group_sources": set(grouped),
        }

    def before_first_batch(self) -> bool:
        """Whether the loader has given no batch of this pass yet (what the trainer waits for then may
        be made in its own process at a cold start: ``TaskStream``)."""
        return self.stats.batches == self._batches_before

    def _counted(self, specs: Iterator[Any]) -> Iterator[Any]:
        for spec in specs:
            self.stats.segments_as_tasks += 1
            yield spec

    def _open(self, specs, tasks: bool = False, early: bool = False):
        from energon_ray.pipeline.data_stream import BlockStream
        from energon_ray.pipeline.streams import TaskStream

        if specs is None:
            return None
        if tasks:
            self.stats.segments_as_tasks += len(specs)
            return specs, TaskStream(specs, self._readers, self._configs, ray_remote_args=self.ray_remote_args,
                                     before_first=self.before_first_batch, **self._chaining())  # fmt: skip
        stream = BlockStream(
            specs, self._readers, self._configs, self.prefetch_batches,
            name=self._name, ray_remote_args=self.ray_remote_args,
            object_store_limit=self.object_store_limit // 4 if early and self.object_store_limit else self.object_store_limit,
        )  # fmt: skip
        if self.on_execute is not None:
            self.on_execute(stream)
        return specs, stream

    def _row_stream(self) -> Iterator[Tuple[int, Row, bool, Optional[List[int]], Optional[List[Any]]]]:
        while self._current is not None:
            specs, stream = self._current
            for out in self._execute(stream, specs):
                if stream.starts_next_early and self._following is None and specs is not None:
                    # the tasks' workers are warm: the feeder's execution of the next window starts
                    # now, holding a quarter of the usual bytes ahead while the tasks' blocks are read
                    self._following = [self._open(next(self._windows, None), early=True)]
                yield out
            self._current = None if specs is None else self._next_window()

    def _next_window(self):
        if self._following is not None:
            (opened,), self._following = self._following, None
            return opened
        return self._open(next(self._windows, None))
