"""Feeds: the leaf datasets' worker streams for one pass, produced by ONE Ray execution.

``MultiFeed`` hands Ray the segments of all leaves in one task list, ordered by when the loader is
expected to need them (``plan.schedule``), executes it window by window through
``iter_torch_batches`` (which decodes and pins rows in Ray's prefetch threads), and files each row
into its leaf's per-worker queues. ``LeafFeed.next_item(worker)`` pulls rows until that worker of
that leaf has an item, so the composition decides the order and Ray only makes the items. One
execution for all sources keeps the driver's overhead that of a single source.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from energon_ray.errors import DatasetConfigError, FatalSampleError, SampleException, ShardReadError
from energon_ray.loader.collate import RowCollate, pin_batch
from energon_ray.loader.merge import EXHAUSTED, LoaderStats, Row, WorkerQueues
from energon_ray.pipeline import rows
from energon_ray.pipeline.stages import Batcher
from energon_ray.plan.schedule import LeafSchedule, NeedFn, windows

logger = logging.getLogger("energon_ray")

#: Most segments (Ray read tasks) one Ray Dataset execution holds. Larger windows cost the driver
#: more (Ray Data's scheduling loop over thousands of pending tasks measured 2x the driver CPU).
MAX_WINDOW_SEGMENTS = 512
#: Segments of the first window of an endless stream (small: a fast first batch).
FIRST_WINDOW_SEGMENTS = 64

_OUR_ERRORS = (FatalSampleError, ShardReadError, DatasetConfigError, SampleException)
_ERROR_LINE = re.compile(r"energon_ray\.errors\.(FatalSampleError|ShardReadError|DatasetConfigError|SampleException): (.*)")


def unwrap_error(exc: BaseException) -> Optional[BaseException]:
    """Our exception behind Ray's wrappers: the object if Ray kept it, else rebuilt from the text."""
    seen, stack = set(), [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _OUR_ERRORS) and current is not exc:
            return type(current)(str(current))
        stack.extend([getattr(current, "cause", None), current.__cause__, current.__context__])
    matches = _ERROR_LINE.findall(str(exc))
    if matches:
        name, message = matches[-1]
        return {e.__name__: e for e in _OUR_ERRORS}[name](message)
    return None


class LeafFeed:
    """One leaf dataset's items per logical worker, filled by the shared ``MultiFeed``."""

    def __init__(self, multi: "MultiFeed", dataset, plan, pin: bool, stats: LoaderStats):
        self.multi = multi
        self.dataset = dataset
        self.plan = plan
        self.pin = pin
        self._batcher: Optional[Batcher] = None
        self.queues = WorkerQueues(
            len(plan.streams), dataset.options.batch_size, self._driver_batches, drop_last=dataset.options.drop_last, stats=stats
        )
        for w in range(len(plan.streams)):
            if plan.num_segments(w) == 0:
                self.queues.close_worker(w)

    def next_item(self, worker: int) -> Any:
        """Worker ``worker``'s next item, or ``EXHAUSTED``; pulls rows from Ray as needed."""
        queues = self.queues
        while not queues.queues[worker]:
            if queues.done[worker]:
                return EXHAUSTED
            self.multi.pull()
        return queues.queues[worker].popleft()

    def exhausted(self, worker: int) -> bool:
        return self.queues.exhausted(worker)

    def close_open_workers(self) -> None:
        for w in range(self.queues.num_workers):
            if not self.queues.done[w]:
                self.queues.close_worker(w)

    def _driver_batches(self, worker: int, group: List[Tuple[int, int, Any]]) -> List[Any]:
        ds = self.dataset
        if ds.options.batch_size is None and not ds.groups_batches:
            made = [item for _, _, item in group]
        else:
            if self._batcher is None:
                self._batcher = Batcher(ds.task_encoder, ds.worker_config.global_error_handler, restore_rng=True)
            runs = self._batcher.new_runs()
            made = self._batcher(group, ds.worker_config.worker_seed(worker), ds.options.batch_size or len(group), runs)
            self.queues.stats.add_report(
                rows.Report(worker=worker, segment=-1, samples_read=0, samples_encoded=0, batches=len(made), runs=runs),
                self.queues.chain,
            )
        return [pin_batch(b) for b in made] if self.pin else made


class MultiFeed:
    """All leaves of a composition for one pass, executed as one Ray Dataset per window.

    Args:
        leaves: the leaf datasets, in the composition's order.
        shares: ``(share, offset)`` of each leaf (see ``plan.schedule``).
        needs: exact ``need(worker, item)`` per leaf where the composition knows it.
        pass_index: epoch of the pass (later ``repeat=False`` passes reshuffle).
        pin: pin batches (CUDA only).
        stats: loader counters.
        prefetch_batches: blocks Ray prefetches.
        ray_remote_args: resources per segment task.
        on_execute: called with each Ray Dataset when its execution starts.
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
        on_execute: Optional[Callable[[Any], None]] = None,
    ):
        self.leaves = list(leaves)
        self.prefetch_batches = prefetch_batches
        self.ray_remote_args = ray_remote_args
        self.on_execute = on_execute
        self.pin = pin
        self.feeds: List[LeafFeed] = []
        self.schedules: List[LeafSchedule] = []
        needs = list(needs) if needs is not None else [None] * len(self.leaves)
        for i, (leaf, (share, offset), need) in enumerate(zip(self.leaves, shares, needs)):
            plan = leaf.plan(pass_index, source=i)
            self.feeds.append(LeafFeed(self, leaf, plan, pin, stats))
            items = plan.segment_length / (leaf.options.batch_size or 1)
            self.schedules.append(LeafSchedule(plan=plan, share=share, offset=offset, items_per_segment=items, need=need))
        self._rows: Optional[Iterator[Tuple[int, Row, bool]]] = None
        self.endless = any(s.plan.num_rounds is None for s in self.schedules)

    def pull(self) -> None:
        """Take one row from Ray and file it with its leaf."""
        if self._rows is None:
            self._rows = self._row_stream()
        try:
            source, row, last = next(self._rows)
        except StopIteration:
            for feed in self.feeds:
                feed.close_open_workers()
            return
        self.feeds[source].queues.feed(row, last)

    def close(self) -> None:
        """Stop the Ray execution."""
        if self._rows is not None:
            self._rows.close()
            self._rows = None

    def _row_stream(self) -> Iterator[Tuple[int, Row, bool]]:
        from energon_ray.pipeline.build import build_dataset

        readers = {i: leaf.reader() for i, leaf in enumerate(self.leaves)}
        configs = {i: leaf.stage_config() for i, leaf in enumerate(self.leaves)}
        name = self.leaves[0].operator_name if len(self.leaves) == 1 else "EnergonSegments"
        for specs in windows(self.schedules, MAX_WINDOW_SEGMENTS, first=FIRST_WINDOW_SEGMENTS):
            ray_ds = build_dataset(specs, readers, configs, name=name, ray_remote_args=self.ray_remote_args)
            if self.on_execute is not None:
                self.on_execute(ray_ds)
            yield from self._execute(ray_ds, specs)

    def _execute(self, ray_ds, specs) -> Iterator[Tuple[int, Row, bool]]:
        cursor = 0
        started = time.perf_counter()
        iterator = ray_ds.iter_torch_batches(
            batch_size=None, collate_fn=RowCollate(self.pin), pin_memory=self.pin, prefetch_batches=self.prefetch_batches
        )
        try:
            for block in iterator:
                for row, source in zip(block.rows, block.sources):
                    spec = specs[cursor] if cursor < len(specs) else None
                    if spec is None or (spec.source, spec.worker, spec.index) != (source, row[1], row[2]):
                        raise RuntimeError(
                            f"energon_ray: Ray returned segment {(source, row[1], row[2])} where the plan expected "
                            f"{None if spec is None else (spec.source, spec.worker, spec.index)}; order is not preserved"
                        )
                    yield source, row, spec.last
                    if row[0] == rows.REPORT:
                        cursor += 1
        except Exception as exc:
            ours = unwrap_error(exc)
            if ours is not None:
                raise ours from None
            raise
        logger.debug("window of %d segments took %.2fs", len(specs), time.perf_counter() - started)
