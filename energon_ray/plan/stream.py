"""A logical worker's sample stream and its cut into segments: position → sample, purely.

Stream position ``p`` of a worker is its ``p``-th sample over all epochs. Segments are runs of
``segment_length`` positions (a multiple of the batch size), except the first ``first_rounds`` of each
worker, which are ``first_length`` long (a quick first batch; longer segments later mean fewer blocks
for the trainer to take); segment ``s`` of every worker forms round ``s``. Ray runs segments as
tasks; the order of outputs is decided here, not by Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

import numpy as np

from energon_ray.plan.order import fixed_epoch, train_epoch_order, val_order


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Everything that decides one worker's order."""

    worker: int
    global_worker: int
    seed: int
    offsets: Tuple[int, ...]
    training: bool
    repeat: bool
    shuffle_over_epochs: Optional[int] = 1
    parallel_shard_iters: int = 16
    shuffle_buffer_size: Optional[int] = None
    excluded: Tuple[int, ...] = ()
    #: Epoch number of stream position 0 (a later ``repeat=False`` pass starts at a later epoch).
    first_epoch: int = 0
    #: ``blend_epochized`` repetitions: the stream ends after ``floor(repetitions * epoch length)``
    #: positions (2 → two shuffled epochs, 0.5 → half of one).
    repetitions: Optional[float] = None

    @property
    def hook_seed(self) -> int:
        """Seed of the stream's hook calls: the worker seed for the first pass, a fresh one for each
        later ``repeat=False`` pass (its augmentations differ from the first pass's)."""
        if self.first_epoch == 0:
            return self.seed
        return int.from_bytes(hashlib.sha1(f"{self.seed}|pass|{self.first_epoch}".encode()).digest()[:4], "big")


class WorkerStream:
    """Maps stream positions of one worker to global sample indices.

    ``prefix``: sample indices that come first (the rest of an epoch that another world size left
    unfinished, see ``loader.elastic``); the stream's own epochs follow it, or, for a finite stream,
    the stream ends with it.

    Example:
        >>> cfg = StreamConfig(worker=0, global_worker=0, seed=1, offsets=(0, 4), training=False, repeat=False)
        >>> WorkerStream(cfg).samples(1, 3).tolist()
        [1, 2]
        >>> WorkerStream(cfg, prefix=np.array([9, 8])).samples(0, 5).tolist()
        [9, 8]
    """

    def __init__(self, config: StreamConfig, prefix: Optional[np.ndarray] = None):
        self.config = config
        self.prefix = None if prefix is None else np.asarray(prefix, dtype=np.int64)
        self._excluded = np.asarray(config.excluded, dtype=np.int64)
        self._epoch_cached = lru_cache(maxsize=2)(self._compute_epoch)
        self.epoch_length = len(self.epoch(0))
        #: every epoch is epoch 0 again (validation; a training worker with one sample, or one unshuffled slice)
        self._fixed = not config.training or fixed_epoch(config.offsets, config.shuffle_over_epochs, config.shuffle_buffer_size)

    @property
    def prefix_length(self) -> int:
        return 0 if self.prefix is None else len(self.prefix)

    def epoch_end(self, position: int) -> int:
        """The end of the epoch a reader at ``position`` is in: the first epoch boundary after 0, or at
        or after ``position`` (the prefix's end is a boundary; so is the stream's end).

        Example:
            >>> cfg = StreamConfig(worker=0, global_worker=0, seed=1, offsets=(0, 4), training=True, repeat=True)
            >>> [WorkerStream(cfg).epoch_end(p) for p in (0, 1, 4, 5)]
            [4, 4, 4, 8]
        """
        length = self.length
        if length is not None and position >= length:
            return length
        p, e = self.prefix_length, self.epoch_length
        if self.prefix is not None and position <= p and (p > 0 or position > 0):
            return p if length is None else min(p, length)
        if not e:
            return position
        offset = max(position - p, 1)
        end = p + -(-offset // e) * e
        return end if length is None else min(end, length)

    def epoch_at(self, position: int) -> int:
        """Epoch number (``first_epoch`` based) of the epoch that starts at boundary ``position``."""
        p = self.prefix_length
        if position <= p or not self.epoch_length:
            return self.config.first_epoch
        return self.config.first_epoch + (position - p) // self.epoch_length

    def _compute_epoch(self, epoch: int) -> np.ndarray:
        c = self.config
        if not c.training:
            return val_order(c.offsets, self._excluded)
        return train_epoch_order(
            c.offsets,
            seed=c.seed,
            epoch=c.first_epoch + epoch,
            shuffle_over_epochs=c.shuffle_over_epochs,
            parallel_shard_iters=c.parallel_shard_iters,
            shuffle_buffer_size=c.shuffle_buffer_size,
            excluded=self._excluded,
        )

    def epoch(self, epoch: int) -> np.ndarray:
        """Sample indices of one epoch."""
        return self._epoch_cached(epoch)

    @property
    def length(self) -> Optional[int]:
        """Total positions (``None`` for an endless stream)."""
        reps = self.config.repetitions
        if self.prefix is not None:
            return None if self.config.repeat and reps is None and self.epoch_length > 0 else len(self.prefix)
        if reps is not None:
            whole = int(reps)
            return whole * self.epoch_length + int(self.epoch_length * (reps - whole))
        if self.config.repeat and self.epoch_length > 0:
            return None
        return self.epoch_length

    def samples(self, start: int, stop: int) -> np.ndarray:
        """Global sample indices at positions ``[start, stop)`` (clipped to the stream's end)."""
        if self.length is not None:
            stop = min(stop, self.length)
        if self.prefix is not None:
            p = len(self.prefix)
            head = self.prefix[min(start, p) : min(stop, p)]
            if stop <= p:
                return head
            return np.concatenate([head, self._epochs(max(start, p) - p, stop - p)])
        return self._epochs(start, stop)

    def _epochs(self, start: int, stop: int) -> np.ndarray:
        if stop <= start or self.epoch_length == 0:
            return np.empty(0, dtype=np.int64)
        if self._fixed and stop - start > self.epoch_length:  # many epochs of one or two samples: no per-epoch loop
            return self.epoch(0)[np.arange(start, stop) % self.epoch_length]
        parts = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.epoch_length)
            take = min(stop - pos, self.epoch_length - offset)
            parts.append(self.epoch(epoch)[offset : offset + take])
            pos += take
        return np.concatenate(parts)


@dataclasses.dataclass(frozen=True)
class SegmentSpec:
    """One Ray task's worth of a worker stream: positions ``[start, start + len(samples))``."""

    worker: int
    global_worker: int
    seed: int
    index: int
    start: int
    samples: np.ndarray
    #: True if the stream ends with this segment.
    last: bool
    #: Which leaf dataset of a composition the segment belongs to.
    source: int = 0
    #: Stream position of each sample when they are not ``start, start + 1, …`` (a restore read).
    positions: Optional[np.ndarray] = None
    #: Restore read: return only these ``(position, sub)`` encoded samples (or packs), unbatched.
    keep: Optional[Tuple[Tuple[int, int], ...]] = None

    def position(self, k: int) -> int:
        """Stream position of the ``k``-th sample."""
        return self.start + k if self.positions is None else int(self.positions[k])

    def __reduce__(self):
        return (
            SegmentSpec,
            (self.worker, self.global_worker, self.seed, self.index, self.start, self.samples, self.last, self.source,
             self.positions, self.keep),
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    """Where the segments of a worker stream start: ``first_rounds`` segments of ``first_length``
    positions, then segments of ``length``.

    Example:
        >>> layout = SegmentLayout(length=8, first_length=4, first_rounds=2)
        >>> [layout.start(i) for i in range(4)], [layout.index(p) for p in (0, 3, 4, 8, 15, 16)]
        ([0, 4, 8, 16], [0, 0, 1, 2, 2, 3])
    """

    length: int
    first_length: int = 0
    first_rounds: int = 0

    def __post_init__(self):
        if self.length < 1 or (self.first_rounds and self.first_length < 1) or self.first_rounds < 0:
            raise ValueError(f"segment lengths must be >= 1: {self}")

    @property
    def ramp(self) -> int:
        """Positions covered by the first (short) segments."""
        return self.first_rounds * self.first_length

    def start(self, index: int) -> int:
        """First position of segment ``index``."""
        if index <= self.first_rounds:
            return index * self.first_length
        return self.ramp + (index - self.first_rounds) * self.length

    def size(self, index: int) -> int:
        """Positions of segment ``index`` (before the stream's end clips it)."""
        return self.first_length if index < self.first_rounds else self.length

    def index(self, position: int) -> int:
        """The segment that holds ``position``."""
        if position < self.ramp:
            return position // self.first_length
        return self.first_rounds + (position - self.ramp) // self.length

    def count(self, positions: int) -> int:
        """Segments of a stream of ``positions`` positions."""
        return 0 if positions <= 0 else self.index(positions - 1) + 1

    def to_list(self) -> List[int]:
        return [self.length, self.first_length, self.first_rounds]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> "SegmentLayout":
        return cls(*(int(v) for v in values))


class SegmentPlan:
    """Cuts the worker streams of one rank into segments, ordered round by round.

    Args:
        streams: one per local worker.
        segment_length: positions per segment (a multiple of the batch size), or the whole layout.
    """

    def __init__(self, streams: Sequence[WorkerStream], segment_length: "int | SegmentLayout", source: int = 0):
        layout = segment_length if isinstance(segment_length, SegmentLayout) else SegmentLayout(int(segment_length))
        self.streams = list(streams)
        self.layout = layout
        self.source = source

    def num_segments(self, worker: int) -> Optional[int]:
        """Segments of a worker's stream (``None`` if endless)."""
        length = self.streams[worker].length
        if length is None:
            return None
        return self.layout.count(length)

    @property
    def num_rounds(self) -> Optional[int]:
        """Rounds until every stream ended (``None`` if any is endless)."""
        counts = [self.num_segments(w) for w in range(len(self.streams))]
        if any(c is None for c in counts):
            return None
        return max(counts, default=0)

    def segment(self, worker: int, index: int) -> Optional[SegmentSpec]:
        """Segment ``index`` of ``worker`` (``None`` past the end of a finite stream)."""
        stream = self.streams[worker]
        start = self.layout.start(index)
        samples = stream.samples(start, start + self.layout.size(index))
        if len(samples) == 0:
            return None
        length = stream.length
        return SegmentSpec(
            worker=worker,
            global_worker=stream.config.global_worker,
            seed=stream.config.hook_seed,
            index=index,
            start=start,
            samples=samples,
            last=length is not None and start + len(samples) >= length,
            source=self.source,
        )

    def rounds(self, first: int, last: int) -> List[SegmentSpec]:
        """All segments of rounds ``[first, last)``, round-major then worker order."""
        out = []
        for r in range(first, last):
            for w in range(len(self.streams)):
                spec = self.segment(w, r)
                if spec is not None:
                    out.append(spec)
        return out
