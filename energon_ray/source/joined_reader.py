"""Reads the samples of a joined segment: each planned row is a row of the join table, and the
samples of every joined dataset it names are read in the same Ray task.

The read row is ``{"__joined__": [raw of dataset 0, raw of dataset 1 or None, …], "__key__": …}``
(the primary's key, shard and sources first); :class:`energon_ray.pipeline.join_load.JoinedSampleLoader`
builds each sample with its own dataset's loader and calls the joiner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from energon_ray.pipeline.rows import SegmentData
from energon_ray.plan.stream import SegmentSpec
from energon_ray.source.reader import ReadSegment, ShardTable

JOINED = "__joined__"


class JoinedReadSegment:
    """Stage 0 of a joined dataset: a ``SegmentSpec`` of join-table rows → ``SegmentData``.

    Args:
        tables: the shard table of each joined dataset (primary first).
        part_filters: per dataset, which parts to keep (``None`` keeps all).
        join: the join table (rows × datasets of sample indices, ``-1``: no sample).
        tolerance: consecutive unreadable samples before ``FatalSampleError`` (per dataset).
    """

    def __init__(
        self,
        tables: Sequence[ShardTable],
        part_filters: Sequence[Optional[Callable[[str], bool]]],
        join: np.ndarray,
        tolerance: int = 100,
    ):
        self.readers = [ReadSegment(t, f, tolerance=tolerance) for t, f in zip(tables, part_filters)]
        self.join = join

    def __call__(self, spec: SegmentSpec) -> SegmentData:
        data = SegmentData(spec=spec)
        rows = self.join[np.asarray(spec.samples, dtype=np.int64)]
        positions = np.asarray([spec.position(k) for k in range(len(spec.samples))], dtype=np.int64)
        parts: List[Dict[int, Any]] = []
        for d, reader in enumerate(self.readers):
            mask = rows[:, d] >= 0
            sub = dataclasses.replace(spec, samples=rows[mask, d], positions=positions[mask], keep=None)
            got = reader(sub) if mask.any() else SegmentData(spec=sub)
            data.runs.extend(got.runs)
            data.read_requests += got.read_requests
            data.read_bytes += got.read_bytes
            data.read_retries += got.read_retries
            if got.fatal is not None and data.fatal is None:
                data.fatal = got.fatal
            parts.append({position: raw for position, _, raw in got.raw})
        for k, row_index in enumerate(spec.samples):
            position = int(positions[k])
            primary = parts[0].get(position)
            if primary is None:  # unreadable primary sample: already counted as a read failure
                continue
            joined = [primary] + [p.get(position) for p in parts[1:]]
            if any(r is None and rows[k, d] >= 0 for d, r in enumerate(joined)):
                continue  # a joined sample that could not be read drops the row (counted as a read failure)
            stale = next((d for d, r in enumerate(joined) if r is not None and r["__key__"] != primary["__key__"]), None)
            if stale is not None:  # the index found by key holds another sample: a stale index, not a join
                if data.fatal is None:
                    data.fatal = ("ShardReadError", self._stale_message(int(row_index), joined, stale))
                break
            raw = {
                JOINED: joined,
                "__key__": primary["__key__"],
                "__shard__": primary["__shard__"],
                # Energon's ("Webdataset", row of the join index), then where the row sits in our plan
                "__restore_key__": ("Webdataset", int(row_index)) + tuple(primary["__restore_key__"][2:]),
                "__sources__": tuple(s for r in joined if r is not None for s in r["__sources__"]),
            }
            data.raw.append((position, int(row_index), raw))
        data.samples_read = len(data.raw)
        return data

    def _stale_message(self, row: int, joined: List[Dict[str, Any]], d: int) -> str:
        first, other = joined[0], joined[d]
        return (
            f"join row {row}: {self.readers[0].shards.dataset_path} gives sample key {first['__key__']!r} (shard "
            f"{first['__shard__']}), but joined dataset #{d} {self.readers[d].shards.dataset_path} gives "
            f"{other['__key__']!r} (shard {other['__shard__']}) at the index its .nv-meta/index.sqlite names for that "
            "key: an index.sqlite no longer matches its shards (stale); prepare the datasets again"
        )
