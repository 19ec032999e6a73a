"""Wires the stages onto a Ray Dataset and runs it: the one place that knows the stage order.

``read (SegmentDatasource) → map_batches(encode_and_batch)`` by default: decode, ``encode_sample``,
``batch`` and ``encode_batch`` run in one stage, so encoded samples are never serialized; Ray fuses
the read into the same task, so only finished batches cross the object store. With
``fuse_stages=False`` encoding and batching are two ``map_batches`` stages (e.g. to give
``encode_batch`` other resources). ``preserve_order`` keeps Ray's output in plan order.

How the loader runs them: by default ``TaskStream`` submits each segment as one plain Ray task that
reads it and runs the same fused stage (``_segment_task``), in plan order, bounded in tasks and
bytes; with ``executor="ray_data"`` the ``Feeder`` actor runs the Ray Dataset above outside the
training process and ``BlockStream`` takes its output. Either way the trainer gets the output blocks
as Arrow tables mapped from the object store (no copy, no per-row work, no Ray iterator threads);
``SeamTasks`` batches leftover samples that straddle segments in Ray tasks, so the trainer never
runs a task-encoder hook.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import pyarrow as pa
import ray

from energon_ray.errors import ExecutionLost
from energon_ray.pipeline.local_start import (
    LOCAL_START_MODES, give_back_memory, local_block, local_chained_block, local_pack, local_seam, local_start_mode, make_here,
)  # fmt: skip
from energon_ray.pipeline.shipped import ship, ship_each, unship
from energon_ray.ray_env import deaf_to_cancel, import_task_modules, is_closed, mark_closed, verbose

# Ray Data is imported where an execution is planned (the feeder), never by the training process.
if TYPE_CHECKING:  # the feeder process never imports the stages (torch, the task encoder's module)
    from energon_ray.pipeline.rows import TableParts
    from energon_ray.pipeline.stages import StageConfig
    from energon_ray.plan.stream import SegmentSpec
    from energon_ray.source.reader import ReadSegment

logger = logging.getLogger("energon_ray")

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


_NODE: List[Optional[str]] = []


def _node() -> Optional[str]:
    """This worker's Ray node id (looked up once per process)."""
    if not _NODE:
        try:
            _NODE.append(ray.get_runtime_context().get_node_id())
        except Exception:
            _NODE.append(None)
    return _NODE[0]


# The map_batches callables get the stage config ``Shipped`` and build their stage in the task.


@deaf_to_cancel
def encode_and_batch(batch, config):
    import_task_modules()
    from energon_ray.pipeline.stages import EncodeAndBatch

    _limit_torch_threads()
    stage = EncodeAndBatch(unship(config))
    stage.batch.node = _node()
    return stage(batch)


@deaf_to_cancel
def encode_samples(batch, config):
    import_task_modules()
    from energon_ray.pipeline.stages import EncodeSamples

    _limit_torch_threads()
    return EncodeSamples(unship(config))(batch)


@deaf_to_cancel
def batch_samples(batch, config):
    import_task_modules()
    from energon_ray.pipeline.stages import BatchSamples

    _limit_torch_threads()
    stage = BatchSamples(unship(config))
    stage.node = _node()
    return stage(batch)


def _map(ds: "ray.data.Dataset", fn, stage, remote: Dict[str, Any]) -> "ray.data.Dataset":
    return ds.map_batches(fn, fn_args=(stage,), batch_size=None, batch_format="pyarrow", zero_copy_batch=True, **remote)


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


class _Run:
    """One execution inside the feeder: its Dataset, its bundle iterator, the next take's number.

    ``start`` and ``close`` may run at the same time (threaded actor): a run closed while it was
    being started stops the executor it just started, so no execution outlives its ``close``."""

    def __init__(self, build_args: tuple):
        self.build_args = build_args
        self.bundles: Optional[Iterator[Any]] = None
        self.executor = None
        self.dataset = None
        self.next_seq = 0
        self.done = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.bundles is not None or self.done:
                return
            self.dataset = build_dataset(*self.build_args[0], **self.build_args[1])
            execute = getattr(self.dataset, "_execute_to_iterator", None)
            if execute is not None:  # Ray 2.60: the executor handle lets close() stop it
                bundles, _, self.executor = execute(capture_executor=False)
            else:  # pragma: no cover - other Ray versions
                bundles = self.dataset.iter_internal_ref_bundles()
            self.bundles = iter(bundles)

    def close(self) -> None:
        with self._lock:
            self.done = True
            executor, self.executor = self.executor, None
            if executor is not None:
                executor.shutdown(force=False)  # cancel its tasks, keep the warm worker processes
            self.bundles = None


@ray.remote(num_cpus=0, max_concurrency=64)
class Feeder:
    """Runs Ray Data executions for the loaders of one trainer process, outside that process.

    Ray Data's streaming executor is a busy thread in whatever process iterates a Dataset; here it
    lives in this actor (on the trainer's node), and the trainer only receives block references, in
    order, one bundle per ``take`` call (it keeps a few calls in flight). Runs of one loader are
    executed one after the other: the next window starts as soon as the previous one is drained.
    """

    def __init__(self, verbose: bool = False) -> None:
        import logging

        self._cond = threading.Condition()
        self._runs: Dict[str, _Run] = {}
        # calls of a threaded actor may start out of order: a take can arrive before its submit
        self._closed: Deque[str] = deque(maxlen=4096)
        self._final_stats: Dict[str, str] = {}
        self._submitted = 0  # executions ever registered (never decreases, unlike len(self._runs))
        import ray.data

        from energon_ray.ray_env import start_ray_data_actors

        start_ray_data_actors()  # created now, not by the first execution (they gate its first tasks)
        if not verbose:  # quiet by default: no progress bars or INFO lines for our executions
            ray.data.DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.ERROR)

    def ping(self) -> bool:
        return True

    def submit(self, run_id: str, segments, readers, configs, kwargs: Dict[str, Any]) -> None:
        """Register (not start) an execution; ``take`` starts it. A run closed before its submit
        arrived (calls of a threaded actor may start out of order) is never registered."""
        with self._cond:
            self._submitted += 1
            if run_id in self._closed:
                return
            self._runs[run_id] = _Run(((segments, readers, configs), {**kwargs, "run_id": run_id}))
            self._cond.notify_all()

    def take(self, run_id: str, seq: int) -> Optional[List[Any]]:
        """The refs of the ``seq``-th output bundle of a run (``None`` once it is drained)."""
        with self._cond:
            self._cond.wait_for(
                lambda: run_id in self._closed or (run_id in self._runs and self._runs[run_id].next_seq == seq)
            )
            run = self._runs.get(run_id)
        if run is None or run.done:
            self._advance(run, seq)
            return None
        try:
            run.start()
            bundle = next(run.bundles, None)
            if bundle is None:
                run.done = True
                return None
            return [entry.ref for entry in bundle.blocks]
        except Exception:
            if run.done:  # closed while this take waited: nobody reads its answer
                return None
            raise
        finally:
            self._advance(run, seq)

    def _advance(self, run: Optional[_Run], seq: int) -> None:
        with self._cond:
            if run is not None and run.next_seq == seq:
                run.next_seq += 1
            self._cond.notify_all()

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

    def stats(self, run_id: str) -> str:
        run = self._runs.get(run_id)
        if run is not None and run.dataset is not None:
            return run.dataset.stats()
        return self._final_stats.get(run_id, "")

    def close(self, run_id: str) -> None:
        mark_closed(run_id)  # first: a task Ray starts from now on reads nothing (see mark_closed)
        run = self._runs.get(run_id)
        if run is not None:
            run.close()
            if run.dataset is not None:
                try:  # kept for stats() before the run is forgotten
                    self._final_stats[run_id] = run.dataset.stats()
                except Exception:  # stats are a courtesy; a stopped execution may have none
                    pass
                while len(self._final_stats) > 64:
                    self._final_stats.pop(next(iter(self._final_stats)))
        with self._cond:
            self._runs.pop(run_id, None)
            self._closed.append(run_id)
            self._cond.notify_all()
        if run is not None:
            # a stopped executor's objects form reference cycles that hold block refs (object-store
            # memory) until Python's cyclic GC runs; free them now
            gc.collect()


_FEEDER: Dict[str, Any] = {}


#: Ray's errors for a lost actor, owner, node or object (``_get`` turns them into ``ExecutionLost``).
_LOST = (
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
)


def feeder() -> Any:
    """This process's feeder actor (one per Ray job), started on this node on first use."""
    job = ray.get_runtime_context().get_job_id()
    handle = _FEEDER.get(job)
    if handle is None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        handle = Feeder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True)).remote(verbose())
        _FEEDER.clear()
        _FEEDER[job] = handle
    return handle


def _new_id(kind: str) -> str:
    """An execution's or task stream's id, unique cluster-wide (close marks are kept in the GCS)."""
    return f"{os.getpid()}-{kind}{next(BlockStream._run_ids)}-{uuid.uuid4().hex[:12]}"


def _finished(ref: Any) -> bool:
    """Whether ``ref``'s object is finished and on this node (``ray.get`` would wait for nothing);
    asks for it to be fetched meanwhile."""
    return bool(ray.wait([ref], timeout=0, fetch_local=True)[0])


class BlockStream:
    """The output blocks of one execution (run by the feeder), in order, as zero-copy Arrow tables.

    ``prefetch`` ``take`` calls stay in flight; their blocks are pulled to this node as soon as the
    references arrive. ``close()`` stops the execution (an abandoned iteration frees its Ray tasks
    and object-store memory).
    """

    _run_ids = itertools.count()
    #: the next window's execution starts when this one is drained (the feeder runs one at a time)
    starts_next_early = False

    def __init__(self, segments, readers, configs, prefetch: int = 4, **kwargs: Any):
        self.run_id = _new_id("r")
        self.feeder = feeder()
        # pickled here, unpickled only by the Ray tasks: the feeder never imports the task encoder
        self.feeder.submit.remote(self.run_id, segments, ship_each(readers), ship(configs), kwargs)
        self.prefetch = max(1, prefetch)
        self._calls: Deque[Any] = deque()
        self._blocks: Deque[Any] = deque()
        self._seq = 0
        self._drained = False
        self.start()

    def start(self) -> None:
        """Keep ``prefetch`` takes in flight (the first ones start the execution)."""
        while not self._drained and len(self._calls) < self.prefetch:
            self._calls.append(self.feeder.take.remote(self.run_id, self._seq))
            self._seq += 1

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        while not self._blocks:
            if not self._calls:
                raise StopIteration
            refs = self._get(self._calls.popleft())
            if refs is None:
                self._drained = True
                self._calls.clear()
                raise StopIteration
            ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            self._blocks.extend(refs)
            self.start()
        self.last_ref = self._blocks.popleft()
        return self._get(self.last_ref)

    def ready(self) -> bool:
        """Whether the next block is here already (taking it waits for nothing)."""
        return bool(self._blocks) and _finished(self._blocks[0])

    @staticmethod
    def _get(ref: Any) -> Any:
        try:
            return ray.get(ref)
        except _LOST as exc:
            _FEEDER.clear()  # the next execution gets a new feeder
            raise ExecutionLost(
                f"energon_ray: Ray lost the execution of this loader's segments ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None

    def stats(self) -> str:
        """Ray Data's per-operator stats of this execution."""
        return ray.get(self.feeder.stats.remote(self.run_id))

    def close(self) -> None:
        self._calls.clear()
        self._blocks.clear()
        self._drained = True
        if not ray.is_initialized():  # Ray was shut down (its executions with it); never start it again
            return
        try:
            self.feeder.close.remote(self.run_id)
        except Exception:  # Ray is shutting down: nothing left to stop
            pass


@ray.remote(num_cpus=1, max_retries=3)
@deaf_to_cancel
def _segment_task(
    spec: "SegmentSpec", reader: Any, config: Any, fuse_stages: bool, stream_id: Optional[str] = None, mark: Optional[str] = None
) -> Optional[pa.Table]:
    """What an execution's fused read + map task makes of one segment, as a plain Ray task (nothing
    once its stream is closed, or ``mark`` is: the loader made the segment itself)."""
    if is_closed(stream_id) or is_closed(mark):  # before any import: a task started after the close costs nothing
        return None
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.source.reader import read_segment

    table = read_segment(spec, reader)
    if fuse_stages:
        return parts(encode_and_batch(table, config))
    return parts(batch_samples(encode_samples(table, config), config))


@ray.remote(num_cpus=1, max_retries=3, num_returns=2)
@deaf_to_cancel
def _chained_segment_task(
    spec: "SegmentSpec", reader: Any, config: Any, carry: Any, stream_id: Optional[str] = None, carry_only: bool = False
) -> Tuple[Optional[Any], Any]:
    """A segment of a chained stream (``chained.chained_segment``): its block (``None`` when
    ``carry_only``) and the carry for the next segment of its worker stream, which Ray hands that
    segment's task (so the stream's segments run one after the other)."""
    if is_closed(stream_id) or carry is None:
        return None, None
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.chained import chained_segment

    _limit_torch_threads()
    table, carry_out = chained_segment(unship(reader)(spec), unship(config), carry, carry_only, _node())
    return parts(table), carry_out


@ray.remote(num_cpus=1, max_retries=3)
@deaf_to_cancel
def _rebuild_chained_task(spec: "SegmentSpec", reader: Any, config: Any, outputs: List[Tuple[int, int, int]]) -> List[Any]:
    import_task_modules()
    from energon_ray.pipeline.chained import rebuild_chained_batch

    _limit_torch_threads()
    return rebuild_chained_batch(unship(reader)(spec), unship(config), outputs)


def rebuild_chained(spec: "SegmentSpec", reader: Any, config: Any, outputs: List[Tuple[int, int, int]], remote_args=None) -> List[Any]:
    """``chained.rebuild_chained_batch`` in a Ray task (where the segment tasks read): the batches."""
    task = _with_options(_rebuild_chained_task, remote_args, _TASK_OPTIONS)
    return ray.get(task.remote(spec, ship_each({spec.source: reader})[spec.source], ship({spec.source: config}), outputs))


def _cluster_cpus() -> int:
    try:
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:  # no answer from the GCS
        return 1


def task_segments(window: int) -> int:
    """With the Ray Data executor: how many segments of a pass's first window (``window`` long) run
    as plain Ray tasks: half the window, at most 32 (the rest is the feeder's Ray Data execution,
    which starts meanwhile); ``ENERGON_RAY_START_WITH_TASKS=0`` turns this off."""
    if os.environ.get("ENERGON_RAY_START_WITH_TASKS", "1").strip().lower() in ("0", "false", "no"):
        return 0
    return max(0, min(32, window // 2))


#: ``ray_remote_args`` that a plain task takes as Ray Data's read/map tasks do.
_TASK_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "scheduling_strategy", "label_selector")
#: the ``ray_remote_args`` that batching and packing tasks take (resources only: they run where Ray puts them)
_GROUP_TASK_OPTIONS = ("num_cpus", "memory", "resources")


def _with_options(task: Any, remote_args: Optional[Dict[str, Any]], keys: Sequence[str]) -> Any:
    """``task`` with those of ``remote_args`` named in ``keys`` (as it is if none)."""
    options = {k: v for k, v in (remote_args or {}).items() if k in keys}
    return task.options(**options) if options else task
#: submissions between two looks at the cluster's CPUs (an autoscaling cluster grows and shrinks)
_RESIZE_EVERY = 32


class TaskStream:
    """Segments as plain Ray tasks, one per segment, their blocks given in order.

    The loader's default executor (``executor="tasks"``) runs a whole pass this way: the trainer
    process submits the tasks and maps their blocks, with no feeder actor, no Ray Data actors and no
    streaming executor to start (measured on 2 cores: those three processes cost ~2.9 CPU-seconds of
    a cold pass, a fifth of the machine's work). With ``executor="ray_data"`` only a pass's first
    segments run here, while the feeder's execution starts.

    In flight: one task per CPU slot of the cluster (its CPUs over a task's ``num_cpus``, looked up
    again every ``_RESIZE_EVERY`` submissions), plus finished blocks waiting ahead of the consumer:
    ``ahead`` of them, and at most ``object_store_limit`` bytes of them (block sizes as measured so
    far). The next task is submitted before a block is waited for, and finished blocks are pulled to
    this node as soon as they are done (``fetch_local``). Tasks are spread over the nodes as Ray
    Data spreads its own (``SPREAD``) unless ``ray_remote_args`` names a scheduling strategy.

    A cold start: while ``warm_up``'s workers still import torch (seconds on a fresh Ray), a block
    the trainer's first batch waits for, if not finished when asked for, is made in this process
    instead (``local_block``: the same bytes), so that batch does not wait for the workers'
    imports; its task, if Ray has not started it yet, then reads nothing. Only blocks asked for
    while ``before_first`` says the pass has given no batch yet (without it: the first block),
    when the trainer waits anyway. ``local_start``: ``"auto"`` (as described), ``"off"``, or
    ``"always"`` (made here whatever the workers do); default ``$ENERGON_RAY_LOCAL_START`` or
    ``"auto"``. If making it here fails (say, the data is only reachable from the workers), the
    block comes from a Ray task as usual.

    A chained leaf (``StageConfig.chained``: a generator ``encode_sample``) runs each segment as a
    ``_chained_segment_task`` that takes the previous segment's carry (an object ref: Ray starts it
    once that segment is done) and returns its own next to its block. At a cold start only a worker
    stream's first segment of a pass from its start is made here, and its task runs all the same
    (the next segment's task needs its carry). A pass that starts inside a worker stream (a restore)
    gets ``chain_start(source, worker)`` = the segment to rebuild the carry from and the stream's
    outputs before it: those segments run once more, giving only their carry
    (``segment_spec(source, worker, index)`` makes their specs).

    Args:
        segments: the segments in output order (any iterable: taken as tasks are submitted).
        readers, configs: per leaf (``SegmentSpec.source``), as ``build_dataset`` takes them.
        ahead: finished blocks that may wait ahead of the consumer (default: one per slot).
        object_store_limit: bytes of finished blocks that may wait ahead of the consumer.
        local_start, before_first: see above.
        chain_start, segment_spec: see above.
    """

    #: with the Ray Data executor, the loader starts the next window's execution as this stream yields
    starts_next_early = True

    def __init__(self, segments, readers, configs, *, ray_remote_args: Optional[Dict[str, Any]] = None,
                 fuse_stages: bool = True, ahead: Optional[int] = None, object_store_limit: Optional[int] = None,
                 local_start: Optional[str] = None, before_first: Optional[Callable[[], bool]] = None,
                 chain_start: Optional[Callable[[int, int], Optional[Tuple[int, int]]]] = None,
                 segment_spec: Optional[Callable[[int, int, int], Any]] = None,
                 **_execution_options: Any):  # fmt: skip
        options = {k: v for k, v in (ray_remote_args or {}).items() if k in _TASK_OPTIONS}
        options.setdefault("scheduling_strategy", "SPREAD")
        self._task = _segment_task.options(**options)
        self._chained_task = _chained_segment_task.options(num_returns=2, **options)
        self._task_cpus = float(options.get("num_cpus", 1) or 0)
        self._fuse = fuse_stages
        if not isinstance(readers, Mapping):
            readers, configs = {0: readers}, {0: configs}
        #: chained leaves, and the carry (ref) each of their worker streams hands its next segment
        self._chained = {source for source, config in configs.items() if getattr(config, "chained", False)}
        self._carries: Dict[Tuple[int, int], Any] = {}
        self._chain_start = chain_start
        self._segment_spec = segment_spec
        # one upload each, shared by the tasks (a task encoder with a tokenizer can be megabytes)
        self._readers = ship_each(readers)
        self._configs = ship(configs)
        self._reader_refs = {k: ray.put(v) for k, v in self._readers.items()}
        self._config_ref = ray.put(self._configs)
        self._todo: Iterator[Any] = iter(segments)
        #: ``(ref, spec, mark)`` of each submitted task whose block the consumer has not taken
        self._refs: Deque[Tuple[Any, Any, Optional[str]]] = deque()
        self._local_start = local_start_mode() if local_start is None else local_start
        if self._local_start not in LOCAL_START_MODES:
            raise ValueError(f"local_start must be one of {', '.join(LOCAL_START_MODES)}, not {self._local_start!r}")
        self._before_first = before_first if before_first is not None else (lambda: self.tasks == 0 or not self._taken)
        #: blocks the consumer took; blocks made in this process (``local_block``)
        self._taken = 0
        self.local_blocks = 0
        #: specs of the submitted tasks whose rows the consumer has not reached (``next_spec``)
        self._specs: Deque[Any] = deque()
        self._ahead = ahead
        self._limit = object_store_limit
        self._block_bytes = 0  # the largest block seen
        self._slots = self._cluster_slots()
        self.stream_id = _new_id("t")
        #: counters for ``stats()``
        self.tasks = 0
        self.blocks_bytes = 0
        self.waited = 0.0
        self.most_in_flight = 0
        self._started = time.perf_counter()
        self._submit()

    def _cluster_slots(self) -> int:
        cpus = _cluster_cpus()
        return max(1, int(cpus // self._task_cpus)) if self._task_cpus > 0 else cpus

    def in_flight_limit(self) -> int:
        """Tasks submitted and not yet taken: one per slot plus the finished blocks allowed ahead."""
        ahead = self._slots if self._ahead is None else max(1, self._ahead)
        if self._limit is not None and self._block_bytes:
            ahead = max(1, min(ahead, self._limit // self._block_bytes))
        return self._slots + ahead

    def _submit(self) -> None:
        limit = self.in_flight_limit()
        while len(self._refs) < limit:
            spec = next(self._todo, None)
            if spec is None:
                break
            local = self._local_start != "off" and self._fresh_or_unchained(spec) and self._before_first()
            mark = f"{self.stream_id}/{self.tasks}" if local else None
            self._refs.append((self._remote(spec, mark), spec, mark))
            self._specs.append(spec)
            self.tasks += 1
            if self.tasks % _RESIZE_EVERY == 0:
                self._slots = self._cluster_slots()
                limit = self.in_flight_limit()
        self.most_in_flight = max(self.most_in_flight, len(self._refs))

    def ready(self) -> bool:
        """Whether the next block is finished and on this node (taking it waits for nothing)."""
        return bool(self._refs) and _finished(self._refs[0][0])

    def next_spec(self) -> Any:
        """The segment whose rows come next (``None`` when none is left)."""
        return self._specs.popleft() if self._specs else None

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if not self._refs:
            raise StopIteration
        ref, spec, mark = self._refs.popleft()
        self._submit()  # the next task starts before this block is waited for
        if len(self._refs) > 1:  # pull finished blocks to this node meanwhile
            ray.wait([r for r, _, _ in self._refs], num_returns=len(self._refs), timeout=0, fetch_local=True)
        started = time.perf_counter()
        if mark is not None and self._before_first() and make_here(self._local_start, lambda: bool(ray.wait([ref], timeout=0, fetch_local=False)[0])):
            ref = self._local(spec, mark, ref)
        self._taken += 1
        self.last_ref = ref
        table = BlockStream._get(ref)
        self.waited += time.perf_counter() - started
        if table is not None:
            self.blocks_bytes += table.nbytes
            self._block_bytes = max(self._block_bytes, table.nbytes)
        return table

    def _remote(self, spec: Any, mark: Optional[str] = None) -> Any:
        """Submit ``spec``'s segment task (``mark``: its own close mark, see ``_local``)."""
        if spec.source in self._chained:
            key = (spec.source, spec.worker)
            carry = self._carries[key] if key in self._carries else self._first_carry(spec)
            block, self._carries[key] = self._chained_task.remote(
                spec, self._reader_refs[spec.source], self._config_ref, carry, self.stream_id, False
            )
            return block
        return self._task.remote(spec, self._reader_refs[spec.source], self._config_ref, self._fuse, self.stream_id, mark)

    def _first_carry(self, spec: Any) -> Any:
        """The carry of a chained worker stream's first segment in this stream: none before it at a
        pass's start; after a restore, rebuilt from where ``chain_start`` says."""
        from energon_ray.pipeline.chained import Carry

        start = None if self._chain_start is None else self._chain_start(spec.source, spec.worker)
        if start is None:
            return Carry(0, [])
        first, outputs = int(start[0]), int(start[1])
        if first >= spec.index:  # the batches broke exactly there: nothing to carry
            return Carry(outputs, [])
        if self._segment_spec is None:
            raise RuntimeError("energon_ray: a chained stream restored inside a worker stream needs segment_spec")
        carry: Any = Carry(outputs, None)
        for index in range(first, spec.index):
            _, carry = self._chained_task.remote(
                self._segment_spec(spec.source, spec.worker, index), self._reader_refs[spec.source], self._config_ref,
                carry, self.stream_id, True,
            )  # fmt: skip
        return carry

    def _fresh_or_unchained(self, spec: Any) -> bool:
        """Whether ``spec``'s block may be made here: any segment of an unchained leaf; of a chained
        one, a worker stream's first segment of a pass from its start (no carry to rebuild)."""
        if spec.source not in self._chained:
            return True
        key = (spec.source, spec.worker)
        return key not in self._carries and (self._chain_start is None or self._chain_start(*key) is None)

    def _local(self, spec: Any, mark: str, ref: Any) -> Any:
        """The block made here, as an object in Ray's store (a seam task may read its leftover
        samples from it, as from a task's block); a new task's if that fails. A chained segment's
        task (``ref``) runs on all the same: the next segment's task waits for its carry."""
        mark_closed(mark)  # its task, if not started yet, reads nothing
        chained = spec.source in self._chained
        try:
            if chained:
                table = local_chained_block(spec, self._readers[spec.source], self._configs, _node())
            else:
                table = local_block(spec, self._readers[spec.source], self._configs, self._fuse, _node())
        except Exception:
            logger.debug("energon_ray: a block could not be made in the loader's process; a Ray task makes it", exc_info=True)
            return ref if chained else self._remote(spec)
        from energon_ray.pipeline.rows import parts

        self.local_blocks += 1
        ref = ray.put(parts(table))
        del table
        give_back_memory()
        return ref

    def stats(self) -> str:
        """What this stream's tasks did (the Ray Data executor reports Ray Data's operators instead)."""
        return (
            f"EnergonSegmentTasks: {self.tasks} segment tasks ({self._slots} slots; blocks made in this process: {self.local_blocks}), "
            f"{self.blocks_bytes / 2**20:.1f} MiB of blocks, {time.perf_counter() - self._started:.2f} s since the first "
            f"submit, {self.waited:.2f} s waited for blocks, at most {self.most_in_flight} tasks in flight"
        )

    def close(self) -> None:
        """Stop: no task of this stream starts reading after ``close()`` (each checks the close mark
        first). Tasks already reading finish their segment; nothing is interrupted, since
        ``ray.cancel`` raises ``KeyboardInterrupt`` wherever the task is, and one that landed in
        ``import torch`` left a worker process whose every later task failed (seen in test_remote)."""
        self._todo = iter(())
        self._specs.clear()
        refs, self._refs = [r for r, _, _ in self._refs], deque()
        if not refs or not ray.is_initialized():
            return
        mark_closed(self.stream_id)


@deaf_to_cancel
def _batch_groups(config: Any, worker: int, seed: int, groups, source: int) -> "TableParts":
    import_task_modules()  # before the config (shipped) is opened: its classes import torch
    from energon_ray.pipeline.rows import parts, resolve_located
    from energon_ray.pipeline.stages import seam_batches

    _limit_torch_threads()
    groups = resolve_located(groups, ray.get)  # a sample blend's samples, read from their blocks here
    return parts(seam_batches(unship(config), worker, seed, groups, source))


_seam_task = ray.remote(num_cpus=1, max_retries=3)(_batch_groups)


@ray.remote(num_cpus=1, max_retries=3)
@deaf_to_cancel
def _repack_task(config: Any, worker: int, seed: int, packs, batch_size: Optional[int], source: int) -> "TableParts":
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.stages import repacked_batches

    _limit_torch_threads()
    return parts(repacked_batches(unship(config), worker, seed, packs, batch_size, source))


def repack(config: Any, source: int, worker: int, seed: int, packs, batch_size: Optional[int], remote_args=None) -> pa.Table:
    """Make packed batches again in a Ray task (``stages.repacked_batches``); waits for its table."""
    task = _with_options(_repack_task, remote_args, _GROUP_TASK_OPTIONS)
    return ray.get(task.remote(ray.put(ship(config)), worker, seed, packs, batch_size, source))


@deaf_to_cancel
def _pack_chunk(config: Any, worker: int, seed: int, samples, buffer_size: int, source: int):
    import_task_modules()
    from energon_ray.pipeline.rows import parts, resolve_located
    from energon_ray.pipeline.stages import seam_packs

    _limit_torch_threads()
    ((_, samples),) = resolve_located([(0, samples)], ray.get)  # read from their blocks here
    table, packs, report = seam_packs(unship(config), worker, seed, samples, buffer_size, source)
    return parts(table), (packs, report)


_pack_task = ray.remote(num_cpus=1, max_retries=3, num_returns=2)(_pack_chunk)


class _Waiting:
    """A group task's result (its table; a packing task's packs): calling waits for it; ``ready()``:
    whether that would wait for nothing."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any):
        self.ref = ref

    def __call__(self) -> Any:
        return ray.get(self.ref)

    def ready(self) -> bool:
        return _finished(self.ref)


class _Made:
    """A group task's result made in this process (``_Waiting``'s interface)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self) -> Any:
        return self.value

    def ready(self) -> bool:
        return True


class SeamTasks:
    """Starts Ray tasks that batch pooled leftover samples (one ``config`` upload per source).

    ``before_first``: as for ``TaskStream``, a group the pass's first batch waits for is batched, and
    a chunk it waits for packed (a packed blend), in this process while Ray's workers still import
    torch (``local_seam``, ``local_pack``: the same batches and packs)."""

    def __init__(self, config: "StageConfig", source: int, remote_args: Optional[Dict[str, Any]] = None,
                 before_first: Optional[Callable[[], bool]] = None):  # fmt: skip
        self._config = config
        self._before_first = before_first
        #: groups batched and chunks packed in this process
        self.local_groups = 0
        self._config_ref = None
        self.source = source
        self._seam_task = _with_options(_seam_task, remote_args, _GROUP_TASK_OPTIONS)
        self._pack_task = _with_options(_pack_task, remote_args, _GROUP_TASK_OPTIONS)

    def submit(self, worker: int, seed: int, groups: List[Tuple[int, List[Tuple[int, int, Any]]]]) -> Callable[[], pa.Table]:
        """Start one task for ``(batch size, group)`` pairs; the returned callable waits for its rows
        (a zero-copy table), its ``ready()`` says whether that would wait."""
        if self._here():
            try:
                table = local_seam(ship(self._config), worker, seed, groups, self.source, ray.get)
                give_back_memory()
            except Exception:
                logger.debug("energon_ray: a group could not be batched in the loader's process; a Ray task does it", exc_info=True)
            else:
                self.local_groups += 1
                return _Made(table)
        return _Waiting(self._seam_task.remote(self._config_ref_once(), worker, seed, groups, self.source))

    def _config_ref_once(self) -> Any:
        """The config, uploaded once for all of this source's tasks."""
        if self._config_ref is None:
            self._config_ref = ray.put(ship(self._config))
        return self._config_ref

    def submit_pack(self, worker: int, seed: int, samples: List[Tuple[int, int, Any]], buffer_size: int) -> Tuple[Any, Callable[[], Any]]:
        """Start packing a chunk of samples in a Ray task: the reference of its packs' table (for
        ``Located`` packs) and a callable waiting for ``(packs' (position, sub), report)``, whose
        ``ready()`` says whether that would wait."""
        if self._here():
            from energon_ray.pipeline.rows import parts

            try:
                table, packs, report = local_pack(ship(self._config), worker, seed, samples, buffer_size, self.source, ray.get)
                table_ref = ray.put(parts(table))  # the batching task reads the packs from the store
                del table
                give_back_memory()
            except Exception:
                logger.debug("energon_ray: a chunk could not be packed in the loader's process; a Ray task does it", exc_info=True)
            else:
                self.local_groups += 1
                return table_ref, _Made((packs, report))
        table_ref, meta_ref = self._pack_task.remote(self._config_ref_once(), worker, seed, samples, buffer_size, self.source)
        return table_ref, _Waiting(meta_ref)

    def _here(self) -> bool:
        """Whether the group or chunk asked for now is made in this process (a cold start, see above)."""
        return self._before_first is not None and self._before_first() and make_here(local_start_mode(), lambda: False)
