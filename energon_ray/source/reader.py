"""Reads the samples a segment plan names, straight from the tar shards via ``.tar.idx``.

Local shards are read run by run of consecutive samples in plan order (one ``pread`` each). Shards
in an object store are read by each Ray worker itself: the segment's samples of each shard are
sorted into runs of consecutive samples and each run is one ranged request (several in flight), so
the bytes read are the samples' own and nothing passes through the driver. Runs closer than
``ENERGON_RAY_STORAGE_MAX_GAP_BYTES`` (default 0) are read as one request, gap included: fewer
requests for a shuffled segment, at the price of the gap's bytes.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from energon_ray.errors import DatasetConfigError, FatalSampleError, IndexMismatchError, ShardReadError
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import ShardReader, consecutive_runs, merge_close_runs, open_shard_reader, sorted_runs
from energon_ray.pipeline.policy import StageRun, describe_error
from energon_ray.pipeline.rows import SegmentData
from energon_ray.plan.stream import SegmentSpec
from energon_ray.samples import SourceInfo
from energon_ray.storage import STATS, StorageError, as_path, is_remote

#: Ranged requests of one segment in flight at once (per Ray worker process).
REMOTE_READS_IN_FLIGHT = 8


@dataclasses.dataclass(frozen=True)
class ShardTable:
    """The split's shards as a reader needs them (small and picklable)."""

    dataset_path: str
    names: Tuple[str, ...]
    paths: Tuple[str, ...]
    starts: Tuple[int, ...]  # global index of each shard's first sample, plus the total
    format: str = "tar"
    #: How the store of a remote dataset is reached (never in the repr; see energon_ray.storage).
    storage: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def remote(self) -> bool:
        return bool(self.paths) and is_remote(self.paths[0])

    def locate(self, indices: np.ndarray) -> np.ndarray:
        """Shard number of each global sample index."""
        return np.searchsorted(np.asarray(self.starts), indices, side="right") - 1


#: Open readers of this process, by shard path (and, remote, the settings that reach it): a Ray
#: worker keeps its files open, and a remote shard's offsets, across tasks.
_READERS: Dict[Any, ShardReader] = {}


def _reader(path: str, name: str, storage: Any = None) -> ShardReader:
    key = (path, storage) if storage is not None else path
    reader = _READERS.get(key)
    if reader is None:
        if len(_READERS) > 256:
            for old in list(_READERS.values())[:128]:
                old.close()
            for old_key in list(_READERS)[:128]:
                del _READERS[old_key]
        if is_remote(path):
            # the dataset folder, for the rebuild command of a missing index (none is found above a URL)
            root = path[: -len(name) - 1] if name and path.endswith("/" + name) else None
            try:
                offsets = read_tar_index(as_path(path, storage), root)
            except (StorageError, DatasetConfigError) as exc:
                raise ShardReadError(f"{exc}") from None
        else:
            offsets = read_tar_index(path)
        reader = _READERS[key] = open_shard_reader(path, name, offsets, storage)
    return reader


_POOL: Optional[ThreadPoolExecutor] = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=REMOTE_READS_IN_FLIGHT, thread_name_prefix="energon_ray_read")
    return _POOL


class ReadSegment:
    """Stage 0: a ``SegmentSpec`` → ``SegmentData`` with the raw parts of each planned sample.

    Args:
        shards: the split's shard table.
        part_filter: which parts to keep (``None`` keeps all).
        tolerance: consecutive unreadable samples before ``FatalSampleError``. A ``.tar.idx`` that
            does not match its tar is no unreadable sample: it stops the read at once (``ShardReadError``).
    """

    def __init__(self, shards: ShardTable, part_filter: Optional[Callable[[str], bool]], tolerance: int = 100):
        self.shards = shards
        self.part_filter = part_filter
        self.tolerance = tolerance

    def __call__(self, spec: SegmentSpec) -> SegmentData:
        data = SegmentData(spec=spec)
        run = StageRun(stage="read", tolerance=self.tolerance)
        data.runs.append(run)
        shard_ids = self.shards.locate(spec.samples)
        local = spec.samples - np.asarray(self.shards.starts)[shard_ids]
        pos = 0
        n = len(spec.samples)
        before = STATS.snapshot()
        try:
            if self.shards.remote:
                self._read_remote(data, run, shard_ids, local, spec)
            else:  # local: runs of consecutive samples in plan order
                while pos < n:
                    shard = int(shard_ids[pos])
                    end = pos
                    while end < n and shard_ids[end] == shard:
                        end += 1
                    self._read_shard(data, run, shard, local[pos:end], spec, pos, spec.samples[pos:end])
                    pos = end
        except (FatalSampleError, ShardReadError) as exc:
            # The driver re-raises by base name, so an IndexMismatchError travels as a ShardReadError.
            data.fatal = ("ShardReadError" if isinstance(exc, ShardReadError) else type(exc).__name__, str(exc))
        if self.shards.remote:
            after = STATS.snapshot()
            data.read_requests, data.read_bytes, data.read_retries = (a - b for a, b in zip(after, before))
        data.samples_read = len(data.raw)
        return data

    def _read_shard(
        self, data: SegmentData, run: StageRun, shard: int, local: np.ndarray, spec: SegmentSpec, base: int, globals_: np.ndarray
    ) -> None:
        name, path = self.shards.names[shard], self.shards.paths[shard]
        reader = _reader(path, name)
        for offset, first, last in consecutive_runs(local):
            data.read_requests += 1
            data.read_bytes += int(reader.offsets[last + 1] - reader.offsets[first])
            for j, (index, chunk) in enumerate(reader.read_run(first, last)):
                self._emit(data, run, reader, index, chunk, spec, base + offset + j, int(globals_[offset + j]))

    def _emit(
        self, data: SegmentData, run: StageRun, reader: ShardReader, index: int, chunk: memoryview,
        spec: SegmentSpec, k: int, gindex: int,
    ) -> None:  # fmt: skip
        """Parse sample ``index`` of ``reader``'s shard (segment position ``k``) into ``data.raw``."""
        name, path = reader.name, reader.path
        try:
            if self.shards.format == "jsonl":
                key, parts, files = str(index), {"json": bytes(chunk)}, (f"{index}.json",)  # line end kept, as Energon's
            else:
                key, parts, files = reader.parse(index, chunk, self.part_filter)
        except IndexMismatchError:
            raise
        except ShardReadError as exc:
            run.failure(f"{path}: sample #{index}: {describe_error(exc)}", spec.position(k))
            return
        run.success()
        raw = dict(parts)
        raw["__key__"] = key
        raw["__shard__"] = name
        position = spec.position(k)
        # Energon's ("Webdataset", index), then where the sample sits in our plan (restore_sample)
        raw["__restore_key__"] = ("Webdataset", gindex, spec.source, spec.worker, position, spec.seed)
        raw["__sources__"] = (
            SourceInfo(dataset_path=self.shards.dataset_path, index=gindex, shard_name=name, file_names=tuple(files)),
        )
        data.raw.append((position, gindex, raw))

    def _read_remote(self, data: SegmentData, run: StageRun, shard_ids: np.ndarray, local: np.ndarray, spec: SegmentSpec) -> None:
        """Fetch each shard's samples of the segment as sorted runs (one ranged request each, several
        in flight), then parse them in plan order, exactly as the local path does."""
        readers: Dict[int, ShardReader] = {}
        for shard in np.unique(shard_ids):
            shard = int(shard)
            readers[shard] = _reader(self.shards.paths[shard], self.shards.names[shard], self.shards.storage)
        gap = getattr(self.shards.storage, "max_gap_bytes", 0)
        jobs: List[Tuple[int, int, int]] = [
            (shard, first, last) for shard in readers
            for first, last in merge_close_runs(sorted_runs(local[shard_ids == shard]), readers[shard].offsets, gap)
        ]  # fmt: skip

        def fetch(job: Tuple[int, int, int]) -> List[Tuple[int, memoryview]]:
            shard, first, last = job
            return list(readers[shard].read_run(first, last))

        chunks: Dict[Tuple[int, int], memoryview] = {}
        if len(jobs) > 1:
            futures = [_pool().submit(fetch, job) for job in jobs]
            try:
                results = [f.result() for f in futures]
            except BaseException:  # a failed run or a cancelled task: no request is started after it
                for f in futures:
                    f.cancel()
                raise
        else:
            results = [fetch(job) for job in jobs]
        for (shard, _, _), samples in zip(jobs, results):
            for index, chunk in samples:
                chunks[(shard, index)] = chunk
        for k in range(len(spec.samples)):
            shard, index = int(shard_ids[k]), int(local[k])
            self._emit(data, run, readers[shard], index, chunks[(shard, index)], spec, k, int(spec.samples[k]))


def read_segment(spec: SegmentSpec, reader: Any) -> pa.Table:
    """One segment's ``SEGMENT`` row, as the read task of a Ray Data execution or a plain Ray task
    emits it (``reader``: a ``ReadSegment``, or one ``Shipped``)."""
    from energon_ray.pipeline.rows import SEGMENT, table
    from energon_ray.pipeline.shipped import unship

    data = unship(reader)(spec)
    return table([(SEGMENT, spec.worker, spec.index, 0, data)], source=spec.source)


def shard_table(dataset) -> ShardTable:
    """The ``ShardTable`` of a ``PreparedDataset``."""
    return ShardTable(
        dataset_path=dataset.root,
        names=tuple(s.name for s in dataset.shards),
        paths=tuple(s.path if is_remote(s.path) else os.path.abspath(s.path) for s in dataset.shards),
        starts=tuple(int(x) for x in dataset.shard_starts),
        format=dataset.format,
        storage=getattr(dataset, "storage", None),
    )
