"""The Ray ``Datasource``: one read task per planned segment, emitting one ``SEGMENT`` row.

Tasks are returned in plan order; with ``preserve_order`` Ray hands their outputs on in that order,
and the loader checks it. ``parallelism`` is ignored on purpose: the plan, not Ray, decides the split.
Readers arrive ``Shipped`` (pickled bytes): the process planning the execution (the feeder) never
imports what reading and decoding need (torch, the user's modules); each read task unpickles its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Mapping, Optional

import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from energon_ray.pipeline.shipped import ship_each
from energon_ray.ray_env import import_task_modules, is_closed
from energon_ray.signals import deaf_to_cancel

if TYPE_CHECKING:
    from energon_ray.plan.stream import SegmentSpec
    from energon_ray.source.reader import ReadSegment


@deaf_to_cancel
def _read(spec: "SegmentSpec", reader: Any) -> List[pa.Table]:
    """A read task's body (in the Ray task, never in the feeder)."""
    import_task_modules()
    from energon_ray.pipeline.rows import contiguous
    from energon_ray.source.reader import read_segment

    return [contiguous(read_segment(spec, reader))]  # Ray Data's block serialization takes no views


class SegmentDatasource(Datasource):
    """Reads planned segments of tar shards.

    Args:
        segments: the segments to read, in output order.
        readers: the read stage of each leaf dataset (shard table + part filter), by source index.
        name: operator name shown in Ray's progress and stats.
        run_id: the execution's id; a task of a closed one (``ray_env.mark_closed``) reads nothing.
    """

    def __init__(self, segments: List["SegmentSpec"], readers: Mapping[int, "ReadSegment"], name: str = "EnergonSegments",
                 run_id: Optional[str] = None):  # fmt: skip
        super().__init__()
        self._segments = segments
        self._readers = ship_each(readers)
        self._name = name
        self._run_id = run_id

    def get_name(self) -> str:
        return self._name

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int = -1, per_task_row_limit: Optional[int] = None, data_context=None) -> List[ReadTask]:
        tasks = []
        for spec in self._segments:
            def read_fn(spec: "SegmentSpec" = spec, reader: Any = self._readers[spec.source], run_id=self._run_id) -> Iterable[pa.Table]:
                if is_closed(run_id):  # started by Ray after its execution was closed: nobody reads it
                    return []
                return _read(spec, reader)

            meta = BlockMetadata(num_rows=1, size_bytes=None, exec_stats=None, input_files=None)
            tasks.append(ReadTask(read_fn, meta, per_task_row_limit=per_task_row_limit))
        return tasks
