"""``SourceFeed``: one source's worker streams for one pass, executed as Ray Datasets.

Rounds of segments run as Ray Datasets (windows); ``iter_torch_batches`` decodes and pins their
rows in Ray's prefetch threads; ``WorkerQueues`` files the items per worker. A feed is pulled
lazily: asking for worker ``w``'s next item consumes rows until one is there, so several feeds (a
blend) each advance only as fast as their items are taken.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

from energon_ray.errors import DatasetConfigError, FatalSampleError, SampleException, ShardReadError
from energon_ray.loader.collate import RowCollate, pin_batch
from energon_ray.loader.merge import EXHAUSTED, LoaderStats, Row, WorkerQueues
from energon_ray.pipeline import rows
from energon_ray.pipeline.stages import Batcher
from energon_ray.plan.stream import SegmentPlan

logger = logging.getLogger("energon_ray")

#: Most segments (Ray read tasks) one Ray Dataset execution holds.
MAX_WINDOW_SEGMENTS = 4096
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


class SourceFeed:
    """Items of one ``EnergonDataset`` per logical worker, produced by Ray for one pass.

    Args:
        dataset: the source.
        first_epoch: epoch of the pass (later ``repeat=False`` passes reshuffle).
        pin: pin batches (CUDA only).
        stats: loader counters.
        prefetch_batches: blocks Ray prefetches.
        ray_remote_args: resources per segment task.
        on_execute: called with each Ray Dataset when its execution starts.
    """

    def __init__(
        self,
        dataset,
        first_epoch: int,
        *,
        pin: bool,
        stats: LoaderStats,
        prefetch_batches: int = 4,
        ray_remote_args: Optional[dict] = None,
        on_execute: Optional[Callable[[Any], None]] = None,
        object_store_limit: Optional[int] = None,
    ):
        self.dataset = dataset
        self.plan: SegmentPlan = dataset.plan(first_epoch)
        self.pin = pin
        self.prefetch_batches = prefetch_batches
        self.ray_remote_args = ray_remote_args
        self.on_execute = on_execute
        self.object_store_limit = object_store_limit
        self.num_workers = len(self.plan.streams)
        self._batcher: Optional[Batcher] = None
        self.queues = WorkerQueues(
            self.num_workers, dataset.options.batch_size, self._driver_batches, drop_last=dataset.options.drop_last, stats=stats
        )
        for w in range(self.num_workers):
            if self.plan.num_segments(w) == 0:
                self.queues.close_worker(w)
        self._rows: Optional[Iterator[Tuple[Row, bool]]] = None

    def next_item(self, worker: int) -> Any:
        """Worker ``worker``'s next item, or ``EXHAUSTED``; pulls rows from Ray as needed."""
        queues = self.queues
        while not queues.queues[worker]:
            if queues.done[worker]:
                return EXHAUSTED
            self._pull()
        return queues.queues[worker].popleft()

    def exhausted(self, worker: int) -> bool:
        return self.queues.exhausted(worker)

    def close(self) -> None:
        """Stop the Ray execution of this feed."""
        if self._rows is not None:
            self._rows.close()
            self._rows = None

    # -- internals -----------------------------------------------------------------------------
    def _pull(self) -> None:
        if self._rows is None:
            self._rows = self._row_stream()
        try:
            row, last = next(self._rows)
        except StopIteration:
            for w in range(self.num_workers):
                if not self.queues.done[w]:
                    self.queues.close_worker(w)
            return
        self.queues.feed(row, last)

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

    def _windows(self) -> Iterator[Tuple[int, int]]:
        workers = max(1, self.num_workers)
        total = self.plan.num_rounds
        if total is not None:
            step = max(1, MAX_WINDOW_SEGMENTS // workers)
            for first in range(0, total, step):
                yield first, min(total, first + step)
            return
        first, size = 0, max(1, FIRST_WINDOW_SEGMENTS // workers)
        while True:
            yield first, first + size
            first += size
            size = min(size * 4, max(1, MAX_WINDOW_SEGMENTS // workers))

    def _row_stream(self) -> Iterator[Tuple[Row, bool]]:
        from energon_ray.pipeline.build import build_dataset

        ds = self.dataset
        reader, config = ds.reader(), ds.stage_config()
        for first, last in self._windows():
            specs = self.plan.rounds(first, last)
            if not specs:
                return
            ray_ds = build_dataset(
                specs, reader, config, name=ds.operator_name, ray_remote_args=self.ray_remote_args,
                object_store_limit=self.object_store_limit,
            )  # fmt: skip
            if self.on_execute is not None:
                self.on_execute(ray_ds)
            yield from self._execute(ray_ds, specs)

    def _execute(self, ray_ds, specs) -> Iterator[Tuple[Row, bool]]:
        cursor = 0
        started = time.perf_counter()
        iterator = ray_ds.iter_torch_batches(
            batch_size=None, collate_fn=RowCollate(self.pin), pin_memory=self.pin, prefetch_batches=self.prefetch_batches
        )
        try:
            for block in iterator:
                for row in block.rows:
                    spec = specs[cursor] if cursor < len(specs) else None
                    if spec is None or (spec.worker, spec.index) != (row[1], row[2]):
                        raise RuntimeError(
                            f"energon_ray: Ray returned segment ({row[1]}, {row[2]}) where the plan expected "
                            f"{None if spec is None else (spec.worker, spec.index)}; order is not preserved"
                        )
                    yield row, spec.last
                    if row[0] == rows.REPORT:
                        cursor += 1
        except Exception as exc:
            ours = unwrap_error(exc)
            if ours is not None:
                raise ours from None
            raise
        logger.debug("window of %d segments took %.2fs", len(specs), time.perf_counter() - started)
