"""A cold start's first batch made in the trainer's own process, the same bytes as Ray would make.

On a fresh Ray every worker is a new process that imports torch and the stages (seconds), where a
DataLoader worker is a fork of the trainer that already has them. Until a pass gives its first
batch, the trainer waits anyway, so ``pipeline.streams.TaskStream`` and ``pipeline.seam_tasks.SeamTasks`` may make a
block, a group or a chunk's packs that batch waits for here instead (``make_here``): the same
stages and hook seeds, hence the same rows, on one torch thread as in a task, with the caller's
random states and torch thread count put back (``as_in_a_task``). Nothing here imports Ray: the caller passes what needs it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator, List, Optional

import pyarrow as pa

from energon_ray.pipeline.shipped import unship

#: ``$ENERGON_RAY_LOCAL_START``: ``auto`` (default), ``off``, or ``always`` (tests, benchmarks)
LOCAL_START_MODES = ("auto", "off", "always")


def local_start_mode() -> str:
    """``$ENERGON_RAY_LOCAL_START`` checked (``1``/``on`` mean ``auto``, ``0``/``no``/``false`` ``off``)."""
    mode = os.environ.get("ENERGON_RAY_LOCAL_START", "").strip().lower() or "auto"
    mode = {"1": "auto", "on": "auto", "0": "off", "no": "off", "false": "off"}.get(mode, mode)
    if mode not in LOCAL_START_MODES:
        raise ValueError(f"ENERGON_RAY_LOCAL_START must be one of {', '.join(LOCAL_START_MODES)}, not {mode!r}")
    return mode


def make_here(mode: str, ready: Callable[[], bool]) -> bool:
    """Whether work the trainer waits for at a cold start is made in its own process (``mode``: see
    ``LOCAL_START_MODES``; ``ready``: whether Ray's result is finished already)."""
    from energon_ray.ray_env import workers_warming

    if mode == "always":
        return True
    return mode == "auto" and workers_warming() and not ready()


@contextlib.contextmanager
def as_in_a_task() -> Iterator[None]:
    """Run a task's work in this process: on one torch thread, as a task does, with the caller's
    random states (Python, NumPy, torch's CPU generator; the hooks reseed them) and torch thread
    count put back after."""
    import random

    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def give_back_memory() -> None:
    """Return to the system what work made here left free in the allocators: Arrow's pool (the
    block's serialized batches, once Ray's store has its copy) and glibc's heap (decoding's and the
    hooks' buffers). The trainer made a block once, at a cold start; the allocators would keep its
    peak for the process's life (measured on 2 CPUs: trainer peak 387 -> 294 MiB; without the block
    made here 255). A few ms, once or twice a pass."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim`` (``None`` elsewhere: macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def local_block(spec: Any, reader: Any, config: Any, fuse_stages: bool, node: Optional[str]) -> pa.Table:
    """The block a segment task makes of ``spec`` (``build._segment_task``), made in this process;
    ``node``: this process's Ray node, reported as the segment's."""
    from energon_ray.pipeline.batch_stages import BatchSamples, EncodeAndBatch
    from energon_ray.pipeline.stages import EncodeSamples
    from energon_ray.source.reader import read_segment

    with as_in_a_task():
        if fuse_stages:  # as the task does: the samples as read, never serialized
            stage = EncodeAndBatch(unship(config))
            stage.batch.node = node
            return stage.segment(unship(reader)(spec))
        batching = BatchSamples(unship(config))
        batching.node = node
        return batching(EncodeSamples(unship(config))(read_segment(spec, reader)))


def local_chained_block(spec: Any, reader: Any, config: Any, node: Optional[str]) -> pa.Table:
    """The block a chained stream's first segment task makes (``build._chained_segment_task``, no
    carry before it: a pass from the stream's start), made in this process."""
    from energon_ray.pipeline.chained import Carry, chained_segment

    with as_in_a_task():
        table, _ = chained_segment(unship(reader)(spec), unship(config), Carry(0, []), False, node)
    return table


def local_group_block(specs: List[Any], readers: Any, config: Any, node: Optional[str]) -> Optional[pa.Table]:
    """The block a group task makes of ``specs`` (``build._group_task``), made in this process: each
    chained worker stream among them from its start (no carry before it)."""
    from energon_ray.pipeline.chained import Carry
    from energon_ray.pipeline.groups import group_block

    configs = unship(config)
    carries, seen = [], set()
    for spec in specs:
        key = (spec.source, spec.worker)
        carries.append(Carry(0, []) if configs[spec.source].chained and key not in seen else None)
        seen.add(key)
    with as_in_a_task():
        table, _ = group_block(specs, lambda spec: unship(readers[spec.source])(spec), configs, carries, node)
    return table


def local_seam(config: Any, worker: int, seed: int, groups, source: int, get: Callable[[Any], Any]) -> pa.Table:
    """The table a seam task makes (``build._batch_groups``), made in this process; ``get`` reads
    the samples' blocks (``ray.get``)."""
    from energon_ray.pipeline.located import resolve_located
    from energon_ray.pipeline.seam_stages import seam_batches

    with as_in_a_task():
        return seam_batches(unship(config), worker, seed, resolve_located(groups, get), source)


def local_pack(config: Any, worker: int, seed: int, samples, buffer_size: int, source: int, get: Callable[[Any], Any],
               offsets: Optional[List[int]] = None, counts: Any = None):  # fmt: skip
    """What a packing task makes of a chunk of drawn samples (``build._pack_chunk``: the packs'
    table, their ``(position, sub)``, the report, the hooks' counts after it), made in this process;
    ``get`` reads the samples' blocks (``ray.get``)."""
    from energon_ray.pipeline.located import resolve_located
    from energon_ray.pipeline.seam_stages import seam_packs

    with as_in_a_task():
        ((_, samples),) = resolve_located([(0, samples)], get)
        return seam_packs(unship(config), worker, seed, samples, buffer_size, source, offsets, counts)
