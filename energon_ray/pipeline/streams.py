"""The default executor's block stream: a loader window's segments as plain Ray tasks, their
blocks given in plan order as zero-copy Arrow tables, bounded in tasks and bytes (``TaskStream``).
The Ray Data executor's is ``pipeline.data_stream.BlockStream``. Ray's own calls are
``pipeline.build``'s (the Ray boundary); this module decides what runs when.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import pyarrow as pa

from energon_ray.pipeline import build
from energon_ray.pipeline.local_start import (
    LOCAL_START_MODES, give_back_memory, local_block, local_chained_block, local_group_block, local_start_mode, make_here,
)
from energon_ray.pipeline.remote_args import waits_holding_cpus_only
from energon_ray.pipeline.shipped import ship, ship_each
from energon_ray.ray_env import mark_closed, node

logger = logging.getLogger("energon_ray")


_IDS = itertools.count()


def new_id(kind: str) -> str:
    """An execution's or task stream's id, unique cluster-wide (close marks are kept in the GCS)."""
    return f"{os.getpid()}-{kind}{next(_IDS)}-{uuid.uuid4().hex[:12]}"


#: submissions between two looks at the cluster's CPUs (an autoscaling cluster grows and shrinks)
_RESIZE_EVERY = 32


def _encoding_early(chained, configs) -> set:
    if not chained:
        return set()
    from energon_ray.pipeline.chained import encodes_without_carry

    return {source for source in chained if encodes_without_carry(configs[source])}


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
    outputs before it (and, where batches are counted, the stream's ``Carry.counts`` before the
    segment the pass resumes at): those segments run once more, giving only their carry
    (``segment_spec(source, worker, index)`` makes their specs).

    Groups: the segments of the leaves in ``group_sources`` (short ones: ``EnergonDataset.task_samples``)
    run several to a task, consecutive segments of the plan (whatever leaf and worker stream) until
    a task holds ``group[0]`` samples (its first tasks, one per slot) or ``group[1]`` (the later
    ones), in one ``group_task`` (``groups.group_block``): its block is theirs one after another,
    and it hands on the carry of each chained worker stream among them. So a block holds the batches
    the trainer takes next, and the trainer holds about one block, not a partly taken one per leaf
    and worker stream. A chained leaf's segments are grouped only where they encode before their
    carry comes (``_early``) and batch plain batches.

    Args:
        segments: the segments in output order (any iterable: taken as tasks are submitted).
        readers, configs: per leaf (``SegmentSpec.source``), as ``build_dataset`` takes them.
        ahead: finished blocks that may wait ahead of the consumer (default: one per slot).
        object_store_limit: bytes of finished blocks that may wait ahead of the consumer.
        local_start, before_first: see above.
        chain_start, segment_spec: see above.
        group, group_sources: see above (``None``: one segment a task).
    """

    #: with the Ray Data executor, the loader starts the next window's execution as this stream yields
    starts_next_early = True

    def __init__(self, segments, readers, configs, *, ray_remote_args: Optional[Dict[str, Any]] = None,
                 fuse_stages: bool = True, ahead: Optional[int] = None, object_store_limit: Optional[int] = None,
                 local_start: Optional[str] = None, before_first: Optional[Callable[[], bool]] = None,
                 chain_start: Optional[Callable[[int, int], Optional[Tuple[int, ...]]]] = None,
                 segment_spec: Optional[Callable[[int, int, int], Any]] = None,
                 group: Optional[Tuple[int, int]] = None, group_sources: Iterable[int] = (),
                 **_execution_options: Any):  # fmt: skip
        self._task, self._chained_task, self._group_task, self._task_cpus = build.segment_tasks(ray_remote_args)
        self._fuse = fuse_stages
        if not isinstance(readers, Mapping):
            readers, configs = {0: readers}, {0: configs}
        #: chained leaves, and the carry (ref) each of their worker streams hands its next segment
        self._chained = {source for source, config in configs.items() if getattr(config, "chained", False)}
        #: chained leaves whose segments encode before their carry comes (``chained.encodes_without_carry``)
        self._early = _encoding_early(self._chained, configs) if waits_holding_cpus_only(ray_remote_args) else set()
        self._carries: Dict[Tuple[int, int], Any] = {}
        self._chain_start = chain_start
        self._segment_spec = segment_spec
        # one upload each, shared by the tasks (a task encoder with a tokenizer can be megabytes)
        self._readers = ship_each(readers)
        self._configs = ship(configs)
        self._reader_refs = {k: build.put(v) for k, v in self._readers.items()}
        self._config_ref = build.put(self._configs)
        self._group = group
        #: leaves whose segments run several to a task (``group``)
        self._groupable = set() if group is None else {
            source for source in group_sources
            if (source in self._early and configs[source].batch_size is not None) or (source not in self._chained and fuse_stages)
        }  # fmt: skip
        self._readers_ref = build.put(self._readers) if self._groupable else None
        self._todo: Iterator[Any] = iter(segments)
        self._peeked: Optional[Any] = None
        #: ``(ref, specs, mark)`` of each submitted task whose block the consumer has not taken
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
        self._nodes = 1  # the cluster's nodes (``_cluster_slots``)
        self._slots = self._cluster_slots()
        self.stream_id = new_id("t")
        #: counters for ``stats()``
        self.tasks = 0
        self.blocks_bytes = 0
        self.waited = 0.0
        self.most_in_flight = 0
        self._started = time.perf_counter()
        self._submit()

    def _cluster_slots(self) -> int:
        """Tasks the cluster can run at once (and, in ``_nodes``, whether blocks may be elsewhere)."""
        cpus, self._nodes = build.cluster_shape()
        return max(1, int(cpus // self._task_cpus)) if self._task_cpus > 0 else cpus

    def in_flight_limit(self) -> int:
        """Tasks submitted and not yet taken: one per slot plus the finished blocks allowed ahead."""
        ahead = self._slots if self._ahead is None else max(1, self._ahead)
        if self._limit is not None and self._block_bytes:
            ahead = max(1, min(ahead, self._limit // self._block_bytes))
        return self._slots + ahead

    def _take(self) -> Optional[Any]:
        spec, self._peeked = (self._peeked, None) if self._peeked is not None else (next(self._todo, None), None)
        return spec

    def _next_specs(self) -> Optional[List[Any]]:
        """The segments of the next task: one, or a group (see the class)."""
        spec = self._take()
        if spec is None or spec.source not in self._groupable:
            return None if spec is None else [spec]
        target = self._group[0] if self.tasks < self._slots else self._group[1]
        specs, samples = [spec], len(spec.samples)
        while samples < target:
            spec = self._take()
            if spec is None:
                break
            if spec.source not in self._groupable:
                self._peeked = spec
                break
            specs.append(spec)
            samples += len(spec.samples)
        return specs

    def _submit(self) -> None:
        limit = self.in_flight_limit()
        while len(self._refs) < limit:
            specs = self._next_specs()
            if specs is None:
                break
            local = self._local_start != "off" and self._fresh_or_unchained(specs) and self._before_first()
            mark = f"{self.stream_id}/{self.tasks}" if local else None
            ref = self._remote(specs[0], mark) if len(specs) == 1 else self._remote_group(specs, mark)
            self._refs.append((ref, specs, mark))
            self._specs.extend(specs)
            self.tasks += 1
            if self.tasks % _RESIZE_EVERY == 0:
                self._slots = self._cluster_slots()
                limit = self.in_flight_limit()
        self.most_in_flight = max(self.most_in_flight, len(self._refs))

    def ready(self) -> bool:
        """Whether the next block is finished and on this node (taking it waits for nothing)."""
        return bool(self._refs) and build.finished(self._refs[0][0])

    def next_spec(self) -> Any:
        """The segment whose rows come next (``None`` when none is left)."""
        return self._specs.popleft() if self._specs else None

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if not self._refs:
            raise StopIteration
        ref, specs, mark = self._refs.popleft()
        self._submit()  # the next task starts before this block is waited for
        if self._nodes > 1 and len(self._refs) > 1:  # pull finished blocks to this node meanwhile
            build.pull([r for r, _, _ in self._refs])  # (~0.4 ms a block on 2 slow cores: not on one node)
        started = time.perf_counter()
        if mark is not None and self._before_first() and make_here(self._local_start, lambda: build.done(ref)):
            ref = self._local(specs, mark, ref)
        self._taken += 1
        self.last_ref = ref
        table = build.get(ref)
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
                spec, self._reader_refs[spec.source], self._config_ref, self._carry_arg(spec, carry), self.stream_id, False
            )
            return block
        return self._task.remote(spec, self._reader_refs[spec.source], self._config_ref, self._fuse, self.stream_id, mark)

    def _remote_group(self, specs: List[Any], mark: Optional[str] = None) -> Any:
        """Submit a group's task: its block's ref (the carries it hands on are kept in ``_carries``)."""
        from energon_ray.pipeline.groups import stream_keys

        carries, seen = [], set()
        for spec in specs:
            key = (spec.source, spec.worker)
            if spec.source not in self._chained or key in seen:
                carries.append(None)  # unchained, or carried on from the group's own segment before
                continue
            seen.add(key)
            carries.append(self._carry_arg(spec, self._carries[key] if key in self._carries else self._first_carry(spec)))
        keys = stream_keys(specs, lambda source: source in self._chained)
        # a group with chained segments runs whatever is made here: the next tasks wait for its carries
        refs = self._group_task(1 + len(keys)).remote(
            specs, self._readers_ref, self._config_ref, carries, 1 + len(keys), self.stream_id, None if keys else mark
        )  # fmt: skip
        if not keys:
            return refs
        for key, ref in zip(keys, refs[1:]):
            self._carries[key] = ref
        return refs[0]

    def _first_carry(self, spec: Any) -> Any:
        """The carry of a chained worker stream's first segment in this stream: none before it at a
        pass's start; after a restore, rebuilt from where ``chain_start`` says."""
        from energon_ray.pipeline.chained import Carry

        start = None if self._chain_start is None else self._chain_start(spec.source, spec.worker)
        if start is None:
            return Carry(0, [])
        first, outputs = int(start[0]), int(start[1])
        # the batches (a packed stream: packing hook calls) counted before spec
        counts = tuple(int(c) for c in start[2:]) if len(start) > 2 else None
        if first >= spec.index:  # the batches broke exactly there: nothing to carry
            return Carry(outputs, [], counts=counts)
        if self._segment_spec is None:
            raise RuntimeError("energon_ray: a chained stream restored inside a worker stream needs segment_spec")
        carry: Any = Carry(outputs, None, counts=counts)
        for index in range(first, spec.index):
            _, carry = self._chained_task.remote(
                self._segment_spec(spec.source, spec.worker, index), self._reader_refs[spec.source], self._config_ref,
                self._carry_arg(spec, carry), self.stream_id, True,
            )  # fmt: skip
        return carry

    def _carry_arg(self, spec: Any, carry: Any) -> Any:
        """The carry as ``spec``'s chained task takes it: one it waits for only after encoding where
        its leaf encodes without it (the segments of a worker stream then encode side by side)."""
        return build.later(carry) if spec.source in self._early else carry

    def _fresh_or_unchained(self, specs: List[Any]) -> bool:
        """Whether the block of ``specs`` (one task's) may be made here: any segments of unchained
        leaves; of a chained one, a worker stream's first segment of a pass from its start (no carry
        to rebuild), and in a group the segments after it."""
        seen = set()
        for spec in specs:
            key = (spec.source, spec.worker)
            if spec.source in self._chained and key not in seen:
                if key in self._carries or (self._chain_start is not None and self._chain_start(*key) is not None):
                    return False
            seen.add(key)
        return True

    def _local(self, specs: List[Any], mark: str, ref: Any) -> Any:
        """The block made here, as an object in Ray's store (a seam task may read its leftover
        samples from it, as from a task's block); a new task's if that fails. A chained segment's
        task (``ref``) runs on all the same: the next segment's task waits for its carry."""
        mark_closed(mark)  # its task, if not started yet, reads nothing
        spec = specs[0]
        chained = any(s.source in self._chained for s in specs)
        try:
            if len(specs) > 1:
                table = local_group_block(specs, self._readers, self._configs, node())
            elif chained:
                table = local_chained_block(spec, self._readers[spec.source], self._configs, node())
            else:
                table = local_block(spec, self._readers[spec.source], self._configs, self._fuse, node())
        except Exception:
            logger.debug("energon_ray: a block could not be made in the loader's process; a Ray task makes it", exc_info=True)
            return ref if chained else (self._remote(spec) if len(specs) == 1 else self._remote_group(specs))
        from energon_ray.pipeline.rows import parts

        self.local_blocks += 1
        ref = build.put(parts(table))
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
        if not refs or not build.running():
            return
        mark_closed(self.stream_id)

