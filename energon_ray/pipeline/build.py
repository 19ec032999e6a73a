"""Wires the stages onto a Ray Dataset and runs it: the one place that knows the stage order.

``read (SegmentDatasource) → map_batches(encode_and_batch)`` by default: decode, ``encode_sample``,
``batch`` and ``encode_batch`` run in one stage, so encoded samples are never serialized; Ray fuses
the read into the same task, so only finished batches cross the object store. With
``fuse_stages=False`` encoding and batching are two ``map_batches`` stages (e.g. to give
``encode_batch`` other resources). ``preserve_order`` keeps Ray's output in plan order.

``execute`` hands the output blocks to the trainer as Arrow tables mapped from the object store
(no copy, no per-row work, no Ray iterator threads); ``SeamTasks`` batches leftover samples that
straddle segments in Ray tasks, so the trainer never runs a task-encoder hook.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import pyarrow as pa
import ray
import ray.data

from energon_ray.pipeline.stages import BatchSamples, EncodeAndBatch, EncodeSamples, StageConfig, seam_batches
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


class BlockStream:
    """The output blocks of a Ray Dataset's execution, in order, as zero-copy Arrow tables.

    Up to ``prefetch`` blocks are asked to be fetched to this node ahead of the consumer (a no-op
    when they were made here). ``close()`` stops the execution (an abandoned iteration frees its
    Ray tasks and object-store memory).
    """

    def __init__(self, ds: "ray.data.Dataset", prefetch: int = 4):
        self.prefetch = max(1, prefetch)
        self._executor = None
        execute = getattr(ds, "_execute_to_iterator", None)
        if execute is not None:  # Ray 2.60: the executor handle lets close() stop it
            self._bundles, _, self._executor = execute(capture_executor=False)
        else:  # pragma: no cover - other Ray versions
            self._bundles = ds.iter_internal_ref_bundles()
        self._bundles = iter(self._bundles)
        self._ahead: Deque[Any] = deque()
        self._done = False

    def _refill(self) -> None:
        while not self._done and len(self._ahead) < self.prefetch:
            bundle = next(self._bundles, None)
            if bundle is None:
                self._done = True
                return
            refs = [entry.ref for entry in bundle.blocks]
            self._ahead.extend(refs)
            ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        self._refill()
        if not self._ahead:
            raise StopIteration
        return ray.get(self._ahead.popleft())

    def close(self) -> None:
        self._ahead.clear()
        self._done = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(force=True)
        close = getattr(self._bundles, "close", None)
        if close is not None:
            close()


@ray.remote(num_cpus=1, max_retries=3)
def _seam_task(config: StageConfig, worker: int, seed: int, batch_size: int, group, source: int) -> pa.Table:
    _limit_torch_threads()
    return seam_batches(config, worker, seed, batch_size, group, source)


class SeamTasks:
    """Starts Ray tasks that batch pooled leftover samples (one ``config`` upload per source)."""

    def __init__(self, config: StageConfig, source: int, remote_args: Optional[Dict[str, Any]] = None):
        self._config = config
        self._config_ref = None
        self.source = source
        self.remote_args = {k: v for k, v in (remote_args or {}).items() if k in ("num_cpus", "memory", "resources")}

    def submit(self, worker: int, seed: int, batch_size: int, group: List[Tuple[int, int, Any]]) -> Callable[[], pa.Table]:
        """Start the task now; the returned function waits for its rows (a zero-copy table)."""
        if self._config_ref is None:
            self._config_ref = ray.put(self._config)
        task = _seam_task.options(**self.remote_args) if self.remote_args else _seam_task
        ref = task.remote(self._config_ref, worker, seed, batch_size, group, self.source)
        return lambda: ray.get(ref)
