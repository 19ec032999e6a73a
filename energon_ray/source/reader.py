"""Reads the samples a segment plan names, straight from the tar shards via ``.tar.idx``."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from energon_ray.errors import FatalSampleError, IndexMismatchError, ShardReadError
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import ShardReader, consecutive_runs
from energon_ray.pipeline.policy import StageRun, describe_error
from energon_ray.pipeline.rows import SegmentData
from energon_ray.plan.stream import SegmentSpec
from energon_ray.samples import SourceInfo


@dataclasses.dataclass(frozen=True)
class ShardTable:
    """The split's shards as a reader needs them (small and picklable)."""

    dataset_path: str
    names: Tuple[str, ...]
    paths: Tuple[str, ...]
    starts: Tuple[int, ...]  # global index of each shard's first sample, plus the total
    format: str = "tar"

    def locate(self, indices: np.ndarray) -> np.ndarray:
        """Shard number of each global sample index."""
        return np.searchsorted(np.asarray(self.starts), indices, side="right") - 1


#: Open readers of this process, by shard path (a Ray worker keeps its files open across tasks).
_READERS: Dict[str, ShardReader] = {}


def _reader(path: str, name: str) -> ShardReader:
    reader = _READERS.get(path)
    if reader is None:
        if len(_READERS) > 256:
            for old in list(_READERS.values())[:128]:
                old.close()
            for key in list(_READERS)[:128]:
                del _READERS[key]
        reader = _READERS[path] = ShardReader(path, name, read_tar_index(path))
    return reader


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
        try:
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
        data.samples_read = len(data.raw)
        return data

    def _read_shard(
        self, data: SegmentData, run: StageRun, shard: int, local: np.ndarray, spec: SegmentSpec, base: int, globals_: np.ndarray
    ) -> None:
        name, path = self.shards.names[shard], self.shards.paths[shard]
        reader = _reader(path, name)
        for offset, first, last in consecutive_runs(local):
            for j, (index, chunk) in enumerate(reader.read_run(first, last)):
                k = offset + j
                try:
                    if self.shards.format == "jsonl":
                        key, parts, files = str(index), {"json": bytes(chunk).rstrip(b"\r\n")}, (f"{name}#{index}",)
                    else:
                        key, parts, files = reader.parse(index, chunk, self.part_filter)
                except IndexMismatchError:
                    raise
                except ShardReadError as exc:
                    run.failure(f"{path}: sample #{index}: {describe_error(exc)}")
                    continue
                run.success()
                gindex = int(globals_[k])
                raw = dict(parts)
                raw["__key__"] = key
                raw["__shard__"] = name
                position = spec.position(base + k)
                # Energon's ("Webdataset", index), then where the sample sits in our plan (restore_sample)
                raw["__restore_key__"] = ("Webdataset", gindex, spec.source, spec.worker, position, spec.seed)
                raw["__sources__"] = (
                    SourceInfo(dataset_path=self.shards.dataset_path, index=gindex, shard_name=name, file_names=tuple(files)),
                )
                data.raw.append((position, gindex, raw))


def shard_table(dataset) -> ShardTable:
    """The ``ShardTable`` of a ``PreparedDataset``."""
    return ShardTable(
        dataset_path=dataset.root,
        names=tuple(s.name for s in dataset.shards),
        paths=tuple(os.path.abspath(s.path) for s in dataset.shards),
        starts=tuple(int(x) for x in dataset.shard_starts),
        format=dataset.format,
    )
