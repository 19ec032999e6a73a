"""The order in which one logical worker visits its samples in one epoch: pure numpy functions.

Validation reads slices in order. Training, per epoch: shuffle the slices, read ``parallel_shard_iters``
of them at once in a uniformly random interleave, then pass the stream through a shuffle buffer.
Each epoch is a function of ``(worker seed, epoch)`` alone, so any position can be reached without
replaying earlier epochs.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

#: Distinguishes the RNG streams of the different plan steps.
_SLICES, _INTERLEAVE, _BUFFER = 1, 2, 3


def epoch_rng(seed: int, epoch: int, step: int) -> np.random.Generator:
    """The generator of one plan step of one epoch of one worker."""
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, step])


def slice_ranges(offsets: Sequence[int]) -> list[np.ndarray]:
    """Sample indices of each slice, from slice boundaries."""
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(offsets[:-1], offsets[1:])]


def sequential_order(offsets: Sequence[int]) -> np.ndarray:
    """All samples of the slices, in order (validation)."""
    if len(offsets) < 2:
        return np.empty(0, dtype=np.int64)
    return np.arange(offsets[0], offsets[-1], dtype=np.int64)


def interleave(lanes: list[np.ndarray], rng: Optional[np.random.Generator]) -> np.ndarray:
    """A uniformly random merge of ``lanes`` that keeps each lane's own order (``rng`` may be
    ``None`` where at most one lane holds samples: nothing is drawn).

    Example:
        >>> out = interleave([np.arange(3), np.arange(10, 12)], np.random.default_rng(0))
        >>> sorted(out.tolist()), [x for x in out.tolist() if x < 10]
        ([0, 1, 2, 10, 11], [0, 1, 2])
    """
    lanes = [lane for lane in lanes if len(lane)]
    if not lanes:
        return np.empty(0, dtype=np.int64)
    if len(lanes) == 1:
        return lanes[0].copy()
    if rng is None:
        raise ValueError(f"interleave: {len(lanes)} lanes hold samples, so it draws, and needs a generator")
    labels = np.repeat(np.arange(len(lanes)), [len(lane) for lane in lanes])
    rng.shuffle(labels)
    out = np.empty(len(labels), dtype=np.int64)
    out[np.argsort(labels, kind="stable")] = np.concatenate(lanes)
    return out


def shuffle_buffer(stream: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Energon's shuffle buffer on indices: fill to ``size``, then emit a random element per input.

    Example:
        >>> sorted(shuffle_buffer(np.arange(10), 4, np.random.default_rng(0)).tolist()) == list(range(10))
        True
    """
    if size <= 1 or len(stream) <= 1:
        return stream.copy()
    draws = rng.random(len(stream))
    buf: list[int] = []
    out = np.empty(len(stream), dtype=np.int64)
    k = 0
    for value in stream.tolist():
        buf.append(value)
        if len(buf) >= size:
            i = int(draws[k] * len(buf))
            out[k] = buf[i]
            buf[i] = buf[-1]
            buf.pop()
            k += 1
    while buf:
        i = int(draws[k] * len(buf))
        out[k] = buf[i]
        buf[i] = buf[-1]
        buf.pop()
        k += 1
    return out


def train_epoch_order(
    offsets: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle_over_epochs: Optional[int] = 1,
    parallel_shard_iters: int = 16,
    shuffle_buffer_size: Optional[int] = None,
    excluded: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Sample indices of one training epoch of one worker.

    Args:
        offsets: the worker's slice boundaries.
        seed: the worker's seed (``WorkerConfig.worker_seed``).
        epoch: epoch number (0, 1, …).
        shuffle_over_epochs: slices are shuffled over this many passes (``None``: no shuffling,
            ``-1``: slices drawn with replacement).
        parallel_shard_iters: how many slices are read at once.
        shuffle_buffer_size: size of the sample shuffle buffer (``None``/``<= 1``: off).
        excluded: sorted global indices to drop (split-file sample excludes).
    """
    # Each step's generator is made only where it draws (making one costs ~20 us: a worker with one
    # or two samples per epoch would pay that per sample); a step that draws nothing gives the same
    # result with any generator, so the order is the same as with all three made.
    slices = slice_ranges(offsets)
    if not slices:
        return np.empty(0, dtype=np.int64)
    if shuffle_over_epochs is None:
        order = np.arange(len(slices))
        lanes_count = 1
    else:
        count = len(slices) if shuffle_over_epochs == -1 else len(slices) * max(1, shuffle_over_epochs)
        if len(slices) == 1:  # every draw picks slice 0
            order = np.zeros(count, dtype=np.int64)
        else:
            rng = epoch_rng(seed, epoch, _SLICES)
            if shuffle_over_epochs == -1:
                order = rng.integers(0, len(slices), size=len(slices))
            else:
                order = rng.permutation(np.tile(np.arange(len(slices)), max(1, shuffle_over_epochs)))
        lanes_count = max(1, min(parallel_shard_iters, len(order)))
    lanes = [
        np.concatenate([slices[j] for j in order[lane::lanes_count]]) if len(order[lane::lanes_count]) else np.empty(0, np.int64)
        for lane in range(lanes_count)
    ]
    draws = sum(1 for lane in lanes if len(lane)) > 1
    stream = interleave(lanes, epoch_rng(seed, epoch, _INTERLEAVE) if draws else None)
    if excluded is not None and len(excluded):
        stream = stream[~np.isin(stream, excluded)]
    if shuffle_buffer_size and shuffle_buffer_size > 1 and len(stream) > 1:
        stream = shuffle_buffer(stream, shuffle_buffer_size, epoch_rng(seed, epoch, _BUFFER))
    return stream


def fixed_epoch(offsets: Sequence[int], shuffle_over_epochs: Optional[int] = 1, shuffle_buffer_size: Optional[int] = None) -> bool:
    """Whether every training epoch of these slices is the same sequence (so one can be repeated):
    one slice of at most one sample, or one slice read in one lane without a shuffle buffer.

    Example:
        >>> fixed_epoch((4, 5), shuffle_buffer_size=100), fixed_epoch((4, 6), shuffle_buffer_size=100), fixed_epoch((4, 6))
        (True, False, True)
    """
    if len(offsets) != 2:
        return len(offsets) < 2
    one_lane = shuffle_over_epochs in (None, 1, -1) and not (shuffle_buffer_size and shuffle_buffer_size > 1)
    return offsets[1] - offsets[0] <= 1 or one_lane


def val_order(offsets: Sequence[int], excluded: Optional[np.ndarray] = None) -> np.ndarray:
    """Sample indices of one validation pass of one worker (slices in order)."""
    stream = sequential_order(offsets)
    if excluded is not None and len(excluded):
        stream = stream[~np.isin(stream, excluded)]
    return stream
