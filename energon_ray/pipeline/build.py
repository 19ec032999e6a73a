"""Wires the stages onto a Ray Dataset: the one place that knows the stage order.

``read (SegmentDatasource) → map_batches(EncodeSamples) → map_batches(BatchSamples)``; Ray fuses
the three into one task per segment, so raw bytes and decoded samples never cross the object store:
only finished batches do. ``preserve_order`` keeps Ray's output in plan order.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import ray
import ray.data

from energon_ray.pipeline.stages import BatchSamples, EncodeSamples, StageConfig
from energon_ray.plan.stream import SegmentSpec
from energon_ray.source.datasource import SegmentDatasource
from energon_ray.source.reader import ReadSegment


def encode_samples(batch, stage: EncodeSamples):
    return stage(batch)


def batch_samples(batch, stage: BatchSamples):
    return stage(batch)


def build_dataset(
    segments: List[SegmentSpec],
    reader: ReadSegment,
    config: StageConfig,
    *,
    name: str = "EnergonSegments",
    ray_remote_args: Optional[Dict[str, Any]] = None,
) -> "ray.data.Dataset":
    """The Ray Dataset of the given segments: rows of items, leftovers and reports.

    Args:
        segments: planned segments, in output order.
        reader: the read stage.
        config: what the task-encoder stages need.
        name: operator name in Ray's progress bars and stats.
        ray_remote_args: resources per task (e.g. ``{"num_cpus": 1}``).
    """
    remote = dict(ray_remote_args or {})
    ds = ray.data.read_datasource(
        SegmentDatasource(segments, reader, name=name),
        override_num_blocks=max(1, len(segments)),
        **remote,
    )
    ds = ds.map_batches(
        encode_samples,
        fn_args=(EncodeSamples(config),),
        batch_size=None,
        batch_format="pyarrow",
        zero_copy_batch=True,
        **remote,
    )
    ds = ds.map_batches(
        batch_samples,
        fn_args=(BatchSamples(config),),
        batch_size=None,
        batch_format="pyarrow",
        zero_copy_batch=True,
        **remote,
    )
    ds.context.execution_options.preserve_order = True
    return ds
