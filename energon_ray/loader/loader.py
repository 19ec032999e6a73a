"""``get_loader``: iterate an ``EnergonDataset`` through Ray Data into the training loop.

Rounds of segments are executed as Ray Datasets (windows); ``iter_torch_batches`` decodes and pins
their rows in Ray's prefetch threads; ``StreamMerger`` puts items into the loader's order.
"""

from __future__ import annotations

import atexit
import logging
import re
import time
import weakref
from typing import Any, Iterator, List, Optional, Tuple

import torch

from energon_ray.errors import DatasetConfigError, FatalSampleError, SampleException, ShardReadError
from energon_ray.loader.collate import RowCollate, pin_batch
from energon_ray.loader.dataset import EnergonDataset
from energon_ray.loader.merge import LoaderStats, StreamMerger, merge
from energon_ray.loader.ray_env import ensure_ray, warm_up
from energon_ray.pipeline import rows
from energon_ray.pipeline.stages import Batcher
from energon_ray.plan.stream import SegmentPlan

logger = logging.getLogger("energon_ray")

#: Most segments (Ray read tasks) one Ray Dataset execution holds.
MAX_WINDOW_SEGMENTS = 4096
#: Segments of the first window of an endless stream (small: a fast first batch).
FIRST_WINDOW_SEGMENTS = 64

_OUR_ERRORS = (FatalSampleError, ShardReadError, DatasetConfigError, SampleException)


def _unwrap(exc: BaseException) -> Optional[BaseException]:
    """Find our own exception inside Ray's wrappers (``RayTaskError``, ``UserCodeException``…)."""
    seen = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _OUR_ERRORS):
            return current
        stack.extend([getattr(current, "cause", None), current.__cause__, current.__context__])
    return None


_ERROR_LINE = re.compile(r"energon_ray\.errors\.(FatalSampleError|ShardReadError|DatasetConfigError|SampleException): (.*)")


def _from_text(exc: BaseException) -> Optional[BaseException]:
    """Rebuild our exception from a Ray task error's text (Ray keeps only the traceback string)."""
    matches = _ERROR_LINE.findall(str(exc))
    if not matches:
        return None
    name, message = matches[-1]
    return {e.__name__: e for e in _OUR_ERRORS}[name](message)


class EnergonLoader:
    """Iterates batches of an ``EnergonDataset`` (what ``get_loader`` returns).

    Args:
        dataset: from ``get_train_dataset`` / ``get_val_dataset``.
        prefetch_batches: blocks Ray prefetches (and decodes/pins) ahead of the loop.
        ray_remote_args: resources per segment task, e.g. ``{"num_cpus": 1}``.
        pin_memory: pin batches (default: when CUDA is available).
    """

    def __init__(
        self,
        dataset: EnergonDataset,
        *,
        prefetch_batches: int = 4,
        ray_remote_args: Optional[dict] = None,
        pin_memory: Optional[bool] = None,
    ):
        if not isinstance(dataset, EnergonDataset):
            raise TypeError(f"get_loader expects the result of get_train_dataset/get_val_dataset, got {type(dataset).__name__}")
        self.dataset = dataset
        self.prefetch_batches = prefetch_batches
        self.ray_remote_args = ray_remote_args
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs CUDA, and this torch has no CUDA device; leave it unset to pin only when CUDA is available")
        self.pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.stats = LoaderStats()
        self._passes = 0
        self._stream: Optional[Iterator[Any]] = None
        self._last_ray_dataset = None
        self._batcher: Optional[Batcher] = None
        self._merger: Optional[StreamMerger] = None
        ensure_ray()
        warm_up()
        # Close a suspended endless stream before Ray shuts down at exit (Ray's own atexit hook runs
        # after ours, since ours is registered later), instead of letting Ray complain at teardown.
        atexit.register(_close_loader, weakref.ref(self))

    def close(self) -> None:
        """Stop a running endless stream and release its Ray execution."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    # -- public --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        epoch_len = self.dataset.options.virtual_epoch_length
        if epoch_len:
            if self._stream is None:
                self._stream = self._forever()
            for _ in range(epoch_len):
                try:
                    yield next(self._stream)
                except StopIteration:
                    self._stream = None
                    return
            return
        if self.dataset.plan().num_rounds is None:
            if self._stream is None:
                self._stream = self._forever()
            yield from self._stream
            return
        first_epoch = self._passes if self.dataset.options.training else 0
        self._passes += 1
        yield from self._one_pass(first_epoch)

    @property
    def ray_dataset(self):
        """The ``ray.data.Dataset`` most recently executed (for ``stats()`` and Ray-native use)."""
        return self._last_ray_dataset

    def ray_stats(self) -> str:
        """Ray's per-operator stats (throughput per stage) of the last executed window."""
        return self._last_ray_dataset.stats() if self._last_ray_dataset is not None else ""

    # -- internals -----------------------------------------------------------------------------
    def _forever(self) -> Iterator[Any]:
        while True:
            first_epoch = self._passes if self.dataset.options.training else 0
            self._passes += 1
            produced = False
            for item in self._one_pass(first_epoch):
                produced = True
                yield item
            if not produced:
                return

    def _driver_batches(self, worker: int, group: List[Tuple[int, int, Any]]) -> List[Any]:
        ds = self.dataset
        if ds.options.batch_size is None:
            return [item for _, _, item in group]
        if self._batcher is None:
            self._batcher = Batcher(ds.task_encoder, ds.worker_config.global_error_handler, restore_rng=True)
        batcher = self._batcher
        runs = batcher.new_runs()
        seed = ds.worker_config.worker_seed(worker)
        made = batcher(group, seed, ds.options.batch_size, runs)
        if self.pin:
            made = [pin_batch(b) for b in made]
        report = rows.Report(worker=worker, segment=-1, samples_read=0, samples_encoded=0, batches=len(made), runs=runs)
        self._merger_report(report)
        return made

    def _merger_report(self, report: rows.Report) -> None:
        if self._merger is not None:
            self._merger._report(report)

    def _one_pass(self, first_epoch: int) -> Iterator[Any]:
        ds = self.dataset
        plan = ds.plan(first_epoch)
        merger = StreamMerger(
            len(plan.streams),
            ds.options.batch_size,
            self._driver_batches,
            drop_last=ds.options.drop_last,
            caps=ds.worker_caps(),
            stats=self.stats,
        )
        self._merger = merger
        for w in range(len(plan.streams)):
            if plan.num_segments(w) == 0:
                merger.close_worker(w)
        yield from merge(merger, self._rows(plan))

    def _windows(self, plan: SegmentPlan) -> Iterator[Tuple[int, int]]:
        workers = max(1, len(plan.streams))
        total = plan.num_rounds
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

    def _rows(self, plan: SegmentPlan) -> Iterator[Tuple[rows_t, bool]]:
        from energon_ray.pipeline.build import build_dataset

        ds = self.dataset
        reader, config = ds.reader(), ds.stage_config()
        for first, last in self._windows(plan):
            specs = plan.rounds(first, last)
            if not specs:
                return
            ray_ds = build_dataset(specs, reader, config, ray_remote_args=self.ray_remote_args)
            self._last_ray_dataset = ray_ds
            yield from self._execute(ray_ds, specs)

    def _execute(self, ray_ds, specs) -> Iterator[Tuple[rows_t, bool]]:
        cursor = 0
        started = time.perf_counter()
        iterator = ray_ds.iter_torch_batches(
            batch_size=None,
            collate_fn=RowCollate(self.pin),
            pin_memory=self.pin,
            prefetch_batches=self.prefetch_batches,
        )
        try:
            for block in iterator:
                for row in block.rows:
                    kind, worker, segment = row[0], row[1], row[2]
                    spec = specs[cursor] if cursor < len(specs) else None
                    if spec is None or (spec.worker, spec.index) != (worker, segment):
                        raise RuntimeError(
                            f"energon_ray: Ray returned segment ({worker}, {segment}) where the plan expected "
                            f"{None if spec is None else (spec.worker, spec.index)}; order is not preserved"
                        )
                    yield row, spec.last
                    if kind == rows.REPORT:
                        cursor += 1
        except Exception as exc:
            ours = _unwrap(exc)
            if ours is not None and ours is not exc:
                raise type(ours)(str(ours)) from None
            named = _from_text(exc)
            if named is not None:
                raise named from None
            raise
        logger.debug("window of %d segments took %.2fs", len(specs), time.perf_counter() - started)


rows_t = Tuple[int, int, int, int, Any]


def _close_loader(ref: "weakref.ref[EnergonLoader]") -> None:
    loader = ref()
    if loader is not None:
        try:
            loader.close()
        except Exception:  # interpreter shutdown: nothing useful left to report
            pass


def get_loader(
    dataset: EnergonDataset,
    *,
    worker_config: Any = None,
    prefetch_factor: Optional[int] = None,
    prefetch_batches: int = 4,
    pin_memory: Optional[bool] = None,
    ray_remote_args: Optional[dict] = None,
    **_ignored: Any,
) -> EnergonLoader:
    """Iterate a dataset's batches, produced by Ray Data.

    Args:
        dataset: from ``get_train_dataset`` / ``get_val_dataset``.
        worker_config: accepted for Energon compatibility (deprecated there too); must match the dataset's.
        prefetch_factor: Energon's name for ``prefetch_batches``.
        prefetch_batches: blocks Ray prefetches ahead.
        pin_memory: pin batch tensors (default: when CUDA is available; never fails on a CPU-only box).
        ray_remote_args: resources per segment task.

    Returns:
        An iterable of the task encoder's batches; ``len()`` is batches per rank and epoch.

    Example:
        >>> loader = get_loader(get_val_dataset(path, batch_size=4))  # doctest: +SKIP
        >>> next(iter(loader))  # doctest: +SKIP
    """
    if worker_config is not None and worker_config != dataset.worker_config:
        raise ValueError(
            f"get_loader: worker_config {worker_config.config()} differs from the dataset's "
            f"{dataset.worker_config.config()}"
        )
    if prefetch_factor is not None:
        prefetch_batches = prefetch_factor
    return EnergonLoader(dataset, prefetch_batches=prefetch_batches, ray_remote_args=ray_remote_args, pin_memory=pin_memory)
