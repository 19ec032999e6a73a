"""Stages of pooled samples (seams): batches and packs made of samples that Ray tasks other than
their segment's encoded (samples that straddle segments, a sample blend's groups, a packed blend's
chunks, a restore's packs made again), with the hook seeds they would have had in place.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Tuple

import pyarrow as pa

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.packing import Packer
from energon_ray.pipeline.policy import StageRun
from energon_ray.pipeline.batcher import Batcher
from energon_ray.pipeline.stages import StageConfig, output_table
from energon_ray.task_encoder.base import TaskEncoder
from energon_ray.task_encoder.context import worker_slot


def _in_worker_slot(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(config, worker, ...)`` runs its hooks as logical worker ``worker`` (``worker_slot``)."""

    @functools.wraps(fn)
    def run(config: StageConfig, worker: int, *args: Any, **kwargs: Any) -> Any:
        with worker_slot(worker, config.num_workers):
            return fn(config, worker, *args, **kwargs)

    return run


@_in_worker_slot
def seam_packs(
    config: StageConfig, worker: int, seed: int, samples: List[Tuple[int, int, Any]], buffer_size: int, source: int = 0,
    offsets: Optional[List[int]] = None, counts: Any = None,
) -> Tuple[pa.Table, List[Tuple[int, int]], rows.Report, Optional[List[int]]]:
    """Pack a chunk of a sample blend's drawn samples (serialized, in draw order) with Energon's
    buffer semantics (``Packer``): a table with one ``LEFTOVER`` row of the packs (each serialized on
    its own, so a batching call reads them from the store by ``Located``), their ``(position, sub)``,
    a report and the packing hooks' counts after the chunk. ``counts``: those before it, or the
    worker's previous chunk's ``(packs, report, counts)``, from which the hooks read Energon's
    indices (``Packer.counts``);
    ``None``: their first sample's position (states saved before they were counted), plus, per
    sample, ``offsets``: the samples of the worker's stream before its dataset's (a validation
    metadataset's)."""
    te: TaskEncoder = config.task_encoder.get()
    if isinstance(counts, tuple):  # the previous chunk's (packs, report, counts after it)
        counts = counts[2]
    items = [(position, sub, serde.loads(payload, copy=False)) for position, sub, payload in samples]
    packer = Packer(te, buffer_size, config.error_handler, config.batch_size,
                    offsets=None if offsets is None else {id(item): int(o) for item, o in zip(items, offsets)})  # fmt: skip
    runs = packer.new_runs()
    fatal, packs = None, []
    try:
        packs = packer(items, seed, runs, counts=None if counts is None else [int(c) for c in counts])
    except FatalSampleError as exc:
        fatal, packs = ("FatalSampleError", str(exc)), []
    report = rows.Report(worker=worker, segment=-1, samples_read=0, samples_encoded=0, batches=0, runs=runs, fatal=fatal)
    table = output_table([(rows.LEFTOVER, worker, -1, 0, rows.pack_leftovers([(None, 0, packs)], worker, -1), None)], source)
    return table, [(int(p), int(sub)) for p, sub, _ in packs], report, packer.counts


def _made_table(made: List[Tuple[Any, List[int]]], runs: List[StageRun], fatal: Any, worker: int, source: int) -> pa.Table:
    """``ITEM`` rows of what a seam call made (with its samples' positions), then its ``REPORT``."""
    report = rows.Report(worker=worker, segment=-1, samples_read=0, samples_encoded=0, batches=len(made), runs=runs, fatal=fatal)
    out = [(rows.ITEM, worker, -1, seq, item, positions) for seq, (item, positions) in enumerate(made)]
    out.append((rows.REPORT, worker, -1, len(made), report, None))
    return output_table(out, source)


@_in_worker_slot
def repacked_batches(
    config: StageConfig, worker: int, seed: int, packs: List[Tuple[int, int, List[Tuple[int, int, Any]]]],
    batch_size: Optional[int], source: int = 0, batch_index: Optional[int] = None,
) -> pa.Table:  # fmt: skip
    """Packs made again from their members (``(position, sub, members)``, members ``(position, sub,
    payload[, index offset])`` serialized and encoded, not post-encoded) with the hook seeds they
    had, then batched as ``batch_size`` packs (``None``: the packs themselves) as batch
    ``batch_index`` of the stream (None: the first pack's position over the size):
    ``restore_sample`` of a packed batch. ``ITEM`` rows and a ``REPORT``."""
    te: TaskEncoder = config.task_encoder.get()
    packer = Packer(te, 1, config.error_handler, batch_size, config.index_offset(worker))
    runs = packer.new_runs()
    fatal, made = None, []
    try:
        items = []
        for position, sub, members, *made in packs:  # (made: the counts the pack's hooks read, or None)
            group = []
            for p, s, payload, *offset in members:  # (offset: a blend's member, its dataset's, see seam_packs)
                group.append((p, s, serde.loads(payload, copy=False)))
                if offset and offset[0]:
                    packer.offsets[id(group[-1])] = int(offset[0])
            made_at = made[0] if made else None
            items += [item for item in packer.pack_group(group, seed, runs, (position, sub // 1000), made_at) if item[1] == sub]
        if batch_size is None:
            made = [(pack, [position]) for position, _, pack in items]
        elif items:
            batcher = Batcher(te, config.error_handler, restore_rng=True)
            batch_runs = batcher.new_runs()
            runs += batch_runs
            made = batcher.with_positions(items, seed, batch_size, batch_runs, batch_index)
    except FatalSampleError as exc:
        fatal = ("FatalSampleError", str(exc))
    return _made_table(made, runs, fatal, worker, source)


@_in_worker_slot
def seam_batches(
    config: StageConfig, worker: int, seed: int, groups: List[Tuple[int, List[Tuple[int, int, Any]]]], source: int = 0
) -> pa.Table:
    """Batch pooled samples (serialized, in stream order), ``(batch size, group)`` after another
    (batch size ``None``: the group's items one by one, not batched): ``ITEM`` rows and a ``REPORT``.

    These are the batches that straddle segments (samples were skipped, a stream ended, or buckets of
    grouped batching filled across segments); they run in a Ray task like every other batch, with the
    same hook seeds as if they had been made in place.
    """
    te: TaskEncoder = config.task_encoder.get()
    batcher = Batcher(te, config.error_handler, restore_rng=True)
    runs = batcher.new_runs()
    fatal = None
    made: List[Tuple[Any, List[int]]] = []
    try:  # batched or grouped pipelines pool samples (an unbatched packed blend only its packs, handed out as they are)
        # (batch size, group[, its batch index in the stream[, the stream's batch counts before it]])
        for batch_size, group, *index in groups:
            samples = [(position, sub, serde.loads(payload, copy=False)) for position, sub, payload in group]
            if batch_size is None:  # an unbatched packed blend's packs, handed out as they are
                made.extend((item, [position]) for position, _, item in samples)
                continue
            counts = list(index[1]) if len(index) > 1 and index[1] is not None else None
            made.extend(batcher.with_positions(samples, seed, batch_size, runs, index[0] if index else None, counts))
    except FatalSampleError as exc:
        fatal = ("FatalSampleError", str(exc))
    return _made_table(made, runs, fatal, worker, source)
