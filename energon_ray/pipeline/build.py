"""Wires the stages onto a Ray Dataset: the one place that knows the stage order.

``read (SegmentDatasource) → map_batches(encode_and_batch)`` by default: decode, ``encode_sample``,
``batch`` and ``encode_batch`` run in one stage, so encoded samples are never serialized; Ray fuses
the read into the same task, so only finished batches cross the object store. With
``fuse_stages=False`` encoding and batching are two ``map_batches`` stages (e.g. to give
``encode_batch`` other resources). ``preserve_order`` keeps Ray's output in plan order.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

import ray
import ray.data

from energon_ray.pipeline.stages import BatchSamples, EncodeAndBatch, EncodeSamples, StageConfig
from energon_ray.plan.stream import SegmentSpec
from energon_ray.source.datasource import SegmentDatasource
from energon_ray.source.reader import ReadSegment

_threads_limited = False


def _limit_torch_threads() -> None:
    """Use as many torch threads as CPUs Ray gave this task (like DataLoader workers use 1)."""
    global _threads_limited
    if _threads_limited:
        return
    import torch

    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    except Exception:
        cpus = 1.0
    torch.set_num_threads(max(1, int(round(cpus))))
    _threads_limited = True


def encode_and_batch(batch, stage: EncodeAndBatch):
    _limit_torch_threads()
    return stage(batch)


def encode_samples(batch, stage: EncodeSamples):
    _limit_torch_threads()
    return stage(batch)


def batch_samples(batch, stage: BatchSamples):
    _limit_torch_threads()
    return stage(batch)


def _map(ds: "ray.data.Dataset", fn, stage, remote: Dict[str, Any]) -> "ray.data.Dataset":
    return ds.map_batches(fn, fn_args=(stage,), batch_size=None, batch_format="pyarrow", zero_copy_batch=True, **remote)


def build_dataset(
    segments: List[SegmentSpec],
    reader: Union[ReadSegment, Mapping[int, ReadSegment]],
    config: Union[StageConfig, Mapping[int, StageConfig]],
    *,
    name: str = "EnergonSegments",
    ray_remote_args: Optional[Dict[str, Any]] = None,
    fuse_stages: bool = True,
    object_store_limit: Optional[int] = None,
) -> "ray.data.Dataset":
    """The Ray Dataset of the given segments: rows of items, leftovers and reports.

    Args:
        segments: planned segments, in output order.
        reader: the read stage, or one per leaf dataset (by ``SegmentSpec.source``).
        config: what the task-encoder stages need, or one per leaf dataset.
        name: operator name in Ray's progress bars and stats.
        ray_remote_args: resources per task (e.g. ``{"num_cpus": 1}``).
        fuse_stages: run encoding and batching in one ``map_batches`` stage.
        object_store_limit: bytes of finished output this stream may hold ahead of the consumer
            (bounds how far one source of a blend runs ahead of its share).
    """
    remote = dict(ray_remote_args or {})
    ds = ray.data.read_datasource(
        SegmentDatasource(segments, reader if isinstance(reader, Mapping) else {0: reader}, name=name),
        override_num_blocks=max(1, len(segments)),
        **remote,
    )
    if fuse_stages:
        ds = _map(ds, encode_and_batch, EncodeAndBatch(config), remote)
    else:
        ds = _map(ds, encode_samples, EncodeSamples(config), remote)
        ds = _map(ds, batch_samples, BatchSamples(config), remote)
    ctx = ds.context
    ctx.execution_options.preserve_order = True
    # Ray Data 2.60 reserves a share (0.5) of the cluster's CPUs per operator by default; with one
    # fused operator that halves the parallelism (measured: 1 of 2 CPUs busy). The plan, not Ray,
    # balances our work, so the reservation is off for our datasets.
    ctx.op_resource_reservation_enabled = False
    if object_store_limit is not None:
        from ray.data import ExecutionResources

        limits = ctx.execution_options.resource_limits
        ctx.execution_options.resource_limits = ExecutionResources(
            cpu=limits.cpu, gpu=limits.gpu, memory=limits.memory, object_store_memory=object_store_limit
        )
    return ds
