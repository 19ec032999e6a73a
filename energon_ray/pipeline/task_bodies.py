"""What the pipeline's Ray tasks run in a worker, Ray-free: the ``map_batches`` stages of a Ray Data
execution (``encode_and_batch``, or ``encode_samples`` then ``batch_samples``) and the bodies of the
plain tasks (a segment, a chained stream's segment and its batches or blocks made again, a group
of short segments, packed batches made again). ``pipeline.build`` makes them Ray tasks and submits them; each imports the
stages on its first call (``ray_env.import_task_modules``), runs deaf to Ray's cancel and uses as
many torch threads as CPUs Ray gave it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import pyarrow as pa

from energon_ray.pipeline.shipped import unship
from energon_ray.ray_env import import_task_modules, is_closed, limit_torch_threads, node
from energon_ray.signals import deaf_to_cancel

if TYPE_CHECKING:  # the feeder process never imports the stages (torch, the task encoder's module)
    from energon_ray.pipeline.rows import TableParts
    from energon_ray.plan.stream import SegmentSpec


# The map_batches callables get the stage config ``Shipped`` and build their stage in the task.


@deaf_to_cancel
def encode_and_batch(batch, config):
    """``batch``: a block of ``SEGMENT`` rows, or a ``SegmentData`` read in this task."""
    import_task_modules()
    from energon_ray.pipeline.batch_stages import EncodeAndBatch
    from energon_ray.pipeline.rows import SegmentData

    limit_torch_threads()
    stage = EncodeAndBatch(unship(config))
    stage.batch.node = node()
    return stage.segment(batch) if isinstance(batch, SegmentData) else stage(batch)


@deaf_to_cancel
def encode_samples(batch, config):
    import_task_modules()
    from energon_ray.pipeline.stages import EncodeSamples

    limit_torch_threads()
    return EncodeSamples(unship(config))(batch)


@deaf_to_cancel
def batch_samples(batch, config):
    import_task_modules()
    from energon_ray.pipeline.batch_stages import BatchSamples

    limit_torch_threads()
    stage = BatchSamples(unship(config))
    stage.node = node()
    return stage(batch)


def ray_data_stage(batch, fn, config):
    """``fn``'s block with each payload in one buffer: Ray Data's block serialization takes no
    ``binary_view`` columns (``rows.contiguous``)."""
    from energon_ray.pipeline.rows import contiguous

    return contiguous(fn(batch, config))


@deaf_to_cancel
def segment_task(
    spec: "SegmentSpec", reader: Any, config: Any, fuse_stages: bool, stream_id: Optional[str] = None, mark: Optional[str] = None
) -> Optional[pa.Table]:
    """What an execution's fused read + map task makes of one segment, as a plain Ray task (nothing
    once its stream is closed, or ``mark`` is: the loader made the segment itself)."""
    if is_closed(stream_id) or is_closed(mark):  # before any import: a task started after the close costs nothing
        return None
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.source.reader import read_segment

    if fuse_stages:  # read and encoded here: the segment's samples as read, never serialized
        return parts(encode_and_batch(unship(reader)(spec), config))
    return parts(batch_samples(encode_samples(read_segment(spec, reader), config), config))


@deaf_to_cancel
def chained_segment_task(
    spec: "SegmentSpec", reader: Any, config: Any, carry: Any, stream_id: Optional[str] = None, carry_only: bool = False
) -> Tuple[Optional[Any], Any]:
    """A segment of a chained stream (``chained.chained_segment``): its block (``None`` when
    ``carry_only``) and the carry for the next segment of its worker stream, which Ray hands that
    segment's task (so the stream's segments run one after the other, or, given a ``LaterCarry``,
    encode side by side and pack one after the other)."""
    if is_closed(stream_id) or carry is None:
        return None, None
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.chained import chained_segment

    limit_torch_threads()
    table, carry_out = chained_segment(unship(reader)(spec), unship(config), carry, carry_only, node())
    return parts(table), carry_out


@deaf_to_cancel
def group_task(
    specs: List["SegmentSpec"], readers: Dict[int, Any], config: Any, carries: List[Any], returns: int,
    stream_id: Optional[str] = None, mark: Optional[str] = None,
) -> Any:  # fmt: skip
    """Several segments in one task (``groups.group_block``): their block, then the carry of each
    chained worker stream among them (``returns`` values in all; nothing once the stream or
    ``mark`` is closed)."""
    if is_closed(stream_id) or is_closed(mark):
        return None if returns == 1 else (None,) * returns
    import_task_modules()
    from energon_ray.pipeline.groups import group_block
    from energon_ray.pipeline.rows import parts

    limit_torch_threads()
    opened: Dict[int, Any] = {}

    def read(spec: "SegmentSpec") -> Any:
        if spec.source not in opened:
            opened[spec.source] = unship(readers[spec.source])
        return opened[spec.source](spec)

    table, carried = group_block(specs, read, unship(config), carries, node())
    if len(carried) != returns - 1:
        raise RuntimeError(f"energon_ray: a group of {len(specs)} segments hands on {len(carried)} carries, not {returns - 1}")
    return parts(table) if returns == 1 else (parts(table), *carried)


@deaf_to_cancel
def rebuild_chained_task(
    spec: "SegmentSpec", reader: Any, config: Any, outputs: List[Tuple[int, int, int]], counts: Optional[Tuple[int, int]] = None
) -> List[Any]:
    import_task_modules()
    from energon_ray.pipeline.chained import rebuild_chained_batch

    limit_torch_threads()
    return rebuild_chained_batch(unship(reader)(spec), unship(config), outputs, counts)


@deaf_to_cancel
def replay_chain_task(reader: Any, config: Any, carry: Any, rebuild: Optional["SegmentSpec"], specs: List["SegmentSpec"]) -> List[Any]:
    import_task_modules()
    from energon_ray.pipeline.chained import replay_chain as replay
    from energon_ray.pipeline.rows import parts

    limit_torch_threads()
    return [parts(table) for table in replay(unship(reader), unship(config), carry, rebuild, specs, node())]


@deaf_to_cancel
def repack_task(config: Any, worker: int, seed: int, packs, batch_size: Optional[int], source: int, batch_index: Optional[int]) -> "TableParts":
    import_task_modules()
    from energon_ray.pipeline.rows import parts
    from energon_ray.pipeline.seam_stages import repacked_batches

    limit_torch_threads()
    return parts(repacked_batches(unship(config), worker, seed, packs, batch_size, source, batch_index))
