"""Which samples each logical worker reads: Energon's sharding, reproduced exactly.

The split's samples ``[start, end)`` are divided over ``world_size * max(1, num_workers)`` global
workers; the remainder goes to workers in generalized bit-reversal order (so it spreads over ranks),
rotated by ``rotation_offset``. Each worker's range is then cut at shard boundaries into slices of
about ``max_samples_per_sequence`` samples.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from energon_ray.plan.stream import StreamConfig, WorkerStream


def bit_reversal_order(length: int) -> List[int]:
    """Generalized bit-reversal permutation: split in halves recursively and interleave.

    Example:
        >>> bit_reversal_order(8)
        [0, 4, 2, 6, 1, 5, 3, 7]
        >>> bit_reversal_order(6)
        [0, 3, 1, 4, 2, 5]
    """

    def rec(items: List[int]) -> List[int]:
        if len(items) <= 2:
            return items
        mid = len(items) // 2
        left, right = rec(items[:mid]), rec(items[mid:])
        out: List[int] = []
        for i in range(max(len(left), len(right))):
            if i < len(left):
                out.append(left[i])
            if i < len(right):
                out.append(right[i])
        return out

    return rec(list(range(length)))


def global_worker_counts(total: int, global_workers: int, rotation_offset: int = 0) -> List[int]:
    """Samples per global worker: ``total // G`` each, one more for ``total % G`` of them."""
    base, extra = divmod(total, global_workers)
    linear = [base + 1 if (i - rotation_offset) % global_workers < extra else base for i in range(global_workers)]
    counts = [0] * global_workers
    for old, new in enumerate(bit_reversal_order(global_workers)):
        counts[new] = linear[old]
    return counts


def worker_ranges(
    start: int,
    end: int,
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    rotation_offset: int = 0,
) -> List[Tuple[int, int]]:
    """``[start, end)`` sample range of each local worker of ``rank``.

    Example:
        >>> worker_ranges(0, 55, rank=0, world_size=1, num_workers=4)
        [(0, 14), (14, 28), (28, 42), (42, 55)]
    """
    workers = max(1, num_workers)
    counts = global_worker_counts(end - start, workers * world_size, rotation_offset)
    offsets = [start]
    for count in counts:
        offsets.append(offsets[-1] + count)
    local = offsets[rank * workers : (rank + 1) * workers + 1]
    return list(zip(local[:-1], local[1:]))


def split_piece(start: int, end: int, max_samples_per_sequence: Optional[int]) -> List[int]:
    """Start offsets of the slices of one shard piece (long pieces are cut into ~equal slices)."""
    length = end - start
    if max_samples_per_sequence is not None and length > max_samples_per_sequence * 1.5:
        count = max(round(length / max_samples_per_sequence), 1)
        step = length / count
        return [start + int(k * step) for k in range(count)]
    return [start]


def slice_offsets(
    start: int, end: int, shard_starts: Sequence[int], max_samples_per_sequence: Optional[int]
) -> Tuple[int, ...]:
    """Slice boundaries (starts plus the final end) of the worker range ``[start, end)``.

    ``shard_starts`` is the cumulative sample count of the split's shards, starting with 0.

    Example:
        >>> slice_offsets(0, 100, [0, 100], 30)
        (0, 33, 66, 100)
    """
    if start >= end:
        return (start,)
    starts: List[int] = []
    for i in range(len(shard_starts) - 1):
        lo, hi = max(start, shard_starts[i]), min(end, shard_starts[i + 1])
        if lo < hi:
            starts.extend(split_piece(lo, hi, max_samples_per_sequence))
    bounds = starts + [end]
    cleaned = [int(a) for a, b in zip(bounds[:-1], bounds[1:]) if a < b]
    return tuple(cleaned + [int(end)])


def compute_subset(total: int, absolute: Optional[Tuple[int, Optional[int]]], ratio: Optional[Tuple[float, float]]) -> Tuple[int, int]:
    """The ``[start, end)`` of a subset: absolute range first, then a ratio of what is left.

    Raises:
        ValueError: if the range leaves ``[0, total]`` or is reversed.
    """
    start, end = 0, total
    if absolute is not None:
        start, end = absolute[0], total if absolute[1] is None else absolute[1]
        if not 0 <= start <= end <= total:
            raise ValueError(f"subset range [{start}, {end}] is outside the {total} samples of the dataset")
    if ratio is not None:
        lo, hi = ratio
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"subset ratio range [{lo}, {hi}] must satisfy 0 <= start <= end <= 1")
        length = end - start
        start, end = start + int(length * lo), start + int(length * hi)
    return start, end


def worker_streams(options: Any, wc: Any, ranges: Sequence[Tuple[int, int]], shard_starts: Sequence[int],
                   excluded: Sequence[int], first_epoch: int = 0, prefixes: Optional[Sequence[Any]] = None) -> List[WorkerStream]:  # fmt: skip
    """One ``WorkerStream`` per local worker of ``wc`` (a ``WorkerConfig``) reading ``ranges`` (its
    workers' ``worker_ranges``) of a dataset whose shards start at ``shard_starts``, as ``options``
    (``PlanOptions``) say; ``excluded``: global indices left out; ``first_epoch`` shifts the shuffles;
    ``prefixes``: per local worker, samples that come before its epochs (``loader.elastic``)."""
    o = options
    out = []
    for local, (a, b) in enumerate(ranges):
        config = StreamConfig(
            worker=local,
            global_worker=wc.global_worker_id(local),
            seed=wc.worker_seed(local),
            offsets=slice_offsets(a, b, shard_starts, o.max_samples_per_sequence if o.training else None),
            training=o.training,
            repeat=o.repeat,
            shuffle_over_epochs=o.shuffle_over_epochs if o.training else None,
            parallel_shard_iters=o.parallel_shard_iters or (16 if o.training else 1),
            shuffle_buffer_size=o.shuffle_buffer_size if o.training else None,
            excluded=tuple(i for i in excluded if a <= i < b),
            first_epoch=first_epoch,
            repetitions=o.repetitions,
        )
        out.append(WorkerStream(config, prefix=None if prefixes is None else prefixes[local]))
    return out
