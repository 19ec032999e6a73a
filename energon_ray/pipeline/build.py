"""The Ray boundary of the pipeline: the stages as Ray tasks and a Ray Dataset, the feeder actor,
and the few Ray calls the block streams and seam tasks make. The one place that knows the stage order.

``read (SegmentDatasource) → map_batches(encode_and_batch)`` by default: decode, ``encode_sample``,
``batch`` and ``encode_batch`` run in one stage, so encoded samples are never serialized; Ray fuses
the read into the same task, so only finished batches cross the object store. With
``fuse_stages=False`` encoding and batching are two ``map_batches`` stages (e.g. to give
``encode_batch`` other resources). ``preserve_order`` keeps Ray's output in plan order.

How the loader runs them (``pipeline.streams``): by default ``TaskStream`` submits each segment as
one plain Ray task that reads it and runs the same fused stage (``_segment_task``), in plan order,
bounded in tasks and bytes; with ``executor="ray_data"`` the ``Feeder`` actor runs the Ray Dataset
above outside the training process and ``BlockStream`` takes its output. Either way the trainer gets
the output blocks as Arrow tables mapped from the object store (no copy, no per-row work, no Ray
iterator threads); ``pipeline.seam_tasks.SeamTasks`` batches leftover samples that straddle
segments in Ray tasks (``_seam_task``, ``_pack_task``), so the trainer never runs a task-encoder hook.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

import pyarrow as pa
import ray

from energon_ray.errors import ExecutionLost
from energon_ray.pipeline.feeder_runs import FeederRuns
from energon_ray.pipeline.remote_args import GROUP_TASK_OPTIONS, TASK_OPTIONS, options_for, with_options
from energon_ray.pipeline.shipped import ship, ship_each, unship
from energon_ray.pipeline.task_bodies import (
    batch_samples, chained_segment_task, encode_and_batch, encode_samples, group_task, ray_data_stage,
    rebuild_chained_task, repack_task, replay_chain_task, segment_task,
)
from energon_ray.ray_env import connected, import_task_modules, limit_torch_threads, verbose
from energon_ray.signals import deaf_to_cancel

# Ray Data is imported where an execution is planned (the feeder), never by the training process.
if TYPE_CHECKING:  # the feeder process never imports the stages (torch, the task encoder's module)
    from energon_ray.pipeline.rows import TableParts
    from energon_ray.pipeline.stages import StageConfig
    from energon_ray.plan.stream import SegmentSpec
    from energon_ray.source.reader import ReadSegment

logger = logging.getLogger("energon_ray")


def _map(ds: "ray.data.Dataset", fn, stage, remote: Dict[str, Any]) -> "ray.data.Dataset":
    return ds.map_batches(
        ray_data_stage, fn_args=(fn, stage), batch_size=None, batch_format="pyarrow", zero_copy_batch=True, **remote
    )


def build_dataset(
    segments: List["SegmentSpec"],
    reader: Union["ReadSegment", Mapping[int, "ReadSegment"]],
    config: Union["StageConfig", Mapping[int, "StageConfig"]],
    *,
    name: str = "EnergonSegments",
    ray_remote_args: Optional[Dict[str, Any]] = None,
    fuse_stages: bool = True,
    object_store_limit: Optional[int] = None,
    run_id: Optional[str] = None,
) -> "ray.data.Dataset":
    """The Ray Dataset of the given segments: rows of items, leftovers and reports.

    Args:
        segments: planned segments, in output order.
        reader: the read stage, or one per leaf dataset (by ``SegmentSpec.source``).
        config: what the task-encoder stages need, or one per leaf dataset (readers and configs
            may come ``Shipped``: this function never unpickles them).
        name: operator name in Ray's progress bars and stats.
        ray_remote_args: resources per task (e.g. ``{"num_cpus": 1}``).
        fuse_stages: run encoding and batching in one ``map_batches`` stage.
        object_store_limit: bytes of finished output this stream may hold ahead of the consumer
            (bounds how far one source of a blend runs ahead of its share).
        run_id: the execution's id: once it is closed (``ray_env.mark_closed``), a task Ray still
            starts reads nothing.
    """
    import ray.data

    from energon_ray.source.datasource import SegmentDatasource

    remote = dict(ray_remote_args or {})
    ds = ray.data.read_datasource(
        SegmentDatasource(segments, ship_each(reader), name=name, run_id=run_id),
        override_num_blocks=max(1, len(segments)),
        **remote,
    )
    config = ship(config)
    if fuse_stages:
        ds = _map(ds, encode_and_batch, config, remote)
    else:
        ds = _map(ds, encode_samples, config, remote)
        ds = _map(ds, batch_samples, config, remote)
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


@ray.remote(num_cpus=0, max_concurrency=64)
class Feeder(FeederRuns):
    """Runs Ray Data executions for the loaders of one trainer process, outside that process.

    Ray Data's streaming executor is a busy thread in whatever process iterates a Dataset; here it
    lives in this actor (on the trainer's node), and the trainer only receives block references, in
    order, one bundle per ``take`` call (it keeps a few calls in flight). Runs of one loader are
    executed one after the other: the next window starts as soon as the previous one is drained.
    """

    def __init__(self, verbose: bool = False) -> None:
        import logging

        super().__init__(build_dataset)
        import ray.data

        from energon_ray.ray_env import start_ray_data_actors

        start_ray_data_actors()  # created now, not by the first execution (they gate its first tasks)
        if not verbose:  # quiet by default: no progress bars or INFO lines for our executions
            ray.data.DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.ERROR)

    def ping(self) -> bool:
        return True

    def usage(self) -> Dict[str, int]:
        """Executions not yet closed and object references this actor holds (an abandoned
        iteration must leave neither behind), executions ever submitted, and whether this process
        imported torch (it never should: readers and stages reach it pickled)."""
        import sys

        with self._cond:
            runs, submitted = len(self._runs), self._submitted
        gc.collect()  # count what is still reachable, not cycles awaiting collection
        refs = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        return {"runs": runs, "submitted": submitted, "refs": len(refs), "torch": int("torch" in sys.modules)}


_FEEDER: Dict[str, Any] = {}


#: Ray's errors for a lost actor, owner, node or object (``get`` turns them into ``ExecutionLost``).
_LOST = (
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
)


def feeder() -> Any:
    """This process's feeder actor (one per connection to Ray), started on this node on first use.

    Kept per connection (``connected``), not per job id: a process that shuts Ray down and starts
    it again (a notebook) is job 01000000 of the new cluster as it was of the old one, whose actor
    is gone."""
    connection = connected()
    handle = _FEEDER.get(connection)
    if handle is None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = connection[1]  # this process's node
        handle = Feeder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True)).remote(verbose())
        _FEEDER.clear()
        _FEEDER[connection] = handle
    return handle


# -- the Ray calls of the block streams and seam tasks (``streams``, ``seam_tasks``) --------------


def finished(ref: Any) -> bool:
    """Whether ``ref``'s object is finished and on this node (``ray.get`` would wait for nothing);
    asks for it to be fetched meanwhile."""
    return bool(ray.wait([ref], timeout=0, fetch_local=True)[0])


def done(ref: Any) -> bool:
    """Whether ``ref``'s object is finished, wherever it is (nothing fetched)."""
    return bool(ray.wait([ref], timeout=0, fetch_local=False)[0])


def pull(refs: List[Any]) -> None:
    """Ask for the finished ones of ``refs`` to be fetched to this node (waits for nothing)."""
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)


def get(ref: Any) -> Any:
    """``ray.get`` of one block or answer; Ray's errors for a lost actor, owner, node or object
    become ``ExecutionLost`` (the loader's signal to run the segments again)."""
    try:
        return ray.get(ref)
    except _LOST as exc:
        _FEEDER.clear()  # the next execution gets a new feeder
        raise ExecutionLost(
            f"energon_ray: Ray lost the execution of this loader's segments ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def values(refs: Any) -> Any:
    """``ray.get``: the objects of ``refs`` (a list) or of one ref, as they are."""
    return ray.get(refs)


def put(value: Any) -> Any:
    """``ray.put``: ``value`` in the object store, its reference."""
    return ray.put(value)


def running() -> bool:
    """Whether Ray is up in this process (a stream closed after ``ray.shutdown`` has nothing to stop)."""
    return ray.is_initialized()


_segment_task = ray.remote(num_cpus=1, max_retries=3)(segment_task)
_chained_segment_task = ray.remote(num_cpus=1, max_retries=3, num_returns=2)(chained_segment_task)
_group_task = ray.remote(num_cpus=1, max_retries=3)(group_task)


#: seconds a chained segment's task waits for its carry holding its CPU (``LaterCarry.wait``)
CARRY_HOLD_S = 2.0


class LaterCarry:
    """The previous segment's carry (an object ref) handed to a chained segment's task inside this
    wrapper, so Ray starts the task at once instead of when that segment is done: the task reads
    and encodes its samples meanwhile and waits for the carry only to pack or batch them
    (``chained.encodes_without_carry``).

    The task looks and waits through the ref's future, not ``ray.get``/``ray.wait``: those tell Ray
    the task is blocked, and Ray lends its CPU to the next task, in a worker process it starts for
    it (its own ``import torch``: ~150-300 MiB and seconds of CPU), even for a look that waits for
    nothing. Measured at 16 workers: 19 worker processes for 16 CPUs. Only a wait longer than
    ``CARRY_HOLD_S`` lets Ray lend the CPU (so a predecessor that needs one, e.g. retried after its
    worker died, always gets one)."""

    __slots__ = ("ref", "_future")

    def __init__(self, ref: Any):
        self.ref = ref
        self._future: Any = None

    def __reduce__(self):
        return LaterCarry, (self.ref,)

    def _watched(self) -> Any:
        if self._future is None:
            self._future = self.ref.future()
        return self._future

    def wait(self, hold: float = CARRY_HOLD_S) -> Any:
        """The carry, waited for holding the task's CPU up to ``hold`` seconds, then as ``ray.get``
        waits (an error of the segment before is raised as ``ray.get`` raises it)."""
        future = self._watched()
        try:
            return future.result(timeout=hold)
        except Exception:  # not there yet, or the segment before failed: ray.get waits or raises
            return ray.get(self.ref)

    def ready(self) -> bool:
        """Whether the carry is there (waits for nothing and asks Ray nothing)."""
        return self._watched().done()


def later(carry: Any) -> Any:
    """``carry`` as a chained segment task's argument that does not wait for it (``LaterCarry``)
    when it is an object ref; a carry at hand as it is."""
    return LaterCarry(carry) if isinstance(carry, ray.ObjectRef) else carry


_rebuild_chained_task = ray.remote(num_cpus=1, max_retries=3)(rebuild_chained_task)


def rebuild_chained(
    spec: "SegmentSpec", reader: Any, config: Any, outputs: List[Tuple[int, int, int]], remote_args=None,
    counts: Optional[Tuple[int, int]] = None,
) -> List[Any]:
    """``chained.rebuild_chained_batch`` in a Ray task (where the segment tasks read): the batches."""
    task = with_options(_rebuild_chained_task, remote_args, TASK_OPTIONS)
    return ray.get(task.remote(spec, ship_each({spec.source: reader})[spec.source], ship({spec.source: config}), outputs, counts))


_replay_chain_task = ray.remote(num_cpus=1, max_retries=3)(replay_chain_task)


def replay_chain(reader: Any, config: Any, carry: Any, rebuild: Optional["SegmentSpec"], specs: List["SegmentSpec"], remote_args=None) -> List[pa.Table]:
    """``chained.replay_chain`` in a Ray task (where the segment tasks read): the segments' blocks."""
    source = specs[0].source
    task = with_options(_replay_chain_task, remote_args, TASK_OPTIONS)
    return ray.get(task.remote(ship_each({source: reader})[source], ship({source: config}), carry, rebuild, specs))


def cluster_cpus() -> int:
    """The cluster's CPUs now (1 when the GCS does not answer)."""
    return cluster_shape()[0]


def cluster_shape() -> Tuple[int, int]:
    """The cluster's CPUs and nodes now (1 and 1 when the GCS does not answer)."""
    try:
        resources = ray.cluster_resources()
    except Exception:  # no answer from the GCS
        return 1, 1
    # each node holds 1 of its own "node:<ip>" resource (nodes on one machine share the key)
    nodes = sum(v for k, v in resources.items() if k.startswith("node:") and k != "node:__internal_head__")
    return max(1, int(resources.get("CPU", 1))), max(1, int(round(nodes)))


def segment_tasks(ray_remote_args: Optional[Dict[str, Any]]) -> Tuple[Any, Any, Any, float]:
    """The segment tasks with the task options of ``ray_remote_args`` (spread over the nodes as Ray
    Data spreads its own, unless it names a scheduling strategy): the plain one, the chained one
    (block and carry), ``group(returns)``: the task of a group of segments (block and carries:
    ``returns`` values), and the CPUs a task takes."""
    options = options_for(ray_remote_args, TASK_OPTIONS)
    options.setdefault("scheduling_strategy", "SPREAD")

    def group(returns: int) -> Any:
        return _group_task.options(num_returns=returns, **options)

    return (_segment_task.options(**options), _chained_segment_task.options(num_returns=2, **options), group,
            float(options.get("num_cpus", 1) or 0))  # fmt: skip


@deaf_to_cancel
def _batch_groups(config: Any, worker: int, seed: int, groups, source: int) -> "TableParts":
    import_task_modules()  # before the config (shipped) is opened: its classes import torch
    from energon_ray.pipeline.located import resolve_located
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.seam_stages import seam_batches

    limit_torch_threads()
    groups = resolve_located(groups, ray.get)  # a sample blend's samples, read from their blocks here
    return parts(seam_batches(unship(config), worker, seed, groups, source))


_seam_task = ray.remote(num_cpus=1, max_retries=3)(_batch_groups)


_repack_task = ray.remote(num_cpus=1, max_retries=3)(repack_task)


def repack(config: Any, source: int, worker: int, seed: int, packs, batch_size: Optional[int], remote_args=None,
           batch_index: Optional[int] = None) -> pa.Table:  # fmt: skip
    """Make packed batches again in a Ray task (``seam_stages.repacked_batches``); waits for its table."""
    task = with_options(_repack_task, remote_args, GROUP_TASK_OPTIONS)
    return ray.get(task.remote(ray.put(ship(config)), worker, seed, packs, batch_size, source, batch_index))


@deaf_to_cancel
def _pack_chunk(config: Any, worker: int, seed: int, samples, buffer_size: int, source: int, offsets: Optional[List[int]] = None,
                counts: Any = None):  # fmt: skip
    import_task_modules()
    from energon_ray.pipeline.located import resolve_located
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.seam_stages import seam_packs

    limit_torch_threads()
    ((_, samples),) = resolve_located([(0, samples)], ray.get)  # read from their blocks here
    table, packs, report, after = seam_packs(unship(config), worker, seed, samples, buffer_size, source, offsets, counts)
    return parts(table), (packs, report, after)


_pack_task = ray.remote(num_cpus=1, max_retries=3, num_returns=2)(_pack_chunk)


def group_tasks(remote_args: Optional[Dict[str, Any]]) -> Tuple[Any, Any]:
    """The tasks that batch pooled samples and pack a chunk of them, with the resources of ``remote_args``."""
    return with_options(_seam_task, remote_args, GROUP_TASK_OPTIONS), with_options(_pack_task, remote_args, GROUP_TASK_OPTIONS)

