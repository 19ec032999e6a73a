"""Where a chained worker stream's carry is rebuilt from after a restore (``QueueCheckpoint.chain``).

A chained stream (``StageConfig.chained``) hands the batch, or packing buffer, still open at a
segment's end to the next segment (``pipeline.chained.Carry``). A checkpoint records where a restore
rebuilds that carry: ``(segment, outputs before it, first position of what is open there, or None
when nothing is[, outputs of batch, batches given])``, from the segments' reports (the counts: where
batches are chained, the stream's before the segment a restore resumes at, ``Carry.counts``). With chained packs it reaches back to the segment
that made the oldest pack still in the pool, so a restore can make those packs again
(``restore.ChainedRead``); where the packing hooks are counted (``packing.Packer``) it adds their
counts before the segment a restore resumes at, then those before the first segment it packs again
(four each: 11 items). No Ray imports.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

#: a reported segment: ``(segment, outputs before it, its outputs, first position of the open tail,
#: the stream's batch (or packing hook) counts after it or None)`` (``Carry.counts``)
Entry = Tuple[int, int, int, Optional[int], Optional[Tuple[int, ...]]]
#: a pooled pack's ``(position, sub)``
PackKey = Tuple[int, int]


class ChainPoints:
    """Per worker stream, the last segments reported, as far back as a restore may rebuild from.

    Args:
        num_workers: logical worker streams.
        unit: what the carry holds the open one of, in outputs: the batch size, or the packing
            buffer size where packs are chained (``packs``).
        packs: the segments pool their packs (``pack_made``): a point reaches back to the oldest one.
    """

    def __init__(self, num_workers: int, unit: int, packs: bool = False):
        self.unit = max(1, int(unit))
        self.packs = packs
        self.log: List[Deque[Entry]] = [deque() for _ in range(num_workers)]
        #: per worker: where the restore the stream started from began (``None``: the pass's start)
        self.base: List[Optional[Tuple[int, ...]]] = [None] * num_workers
        #: per worker (packs): each pooled pack's maker segment
        self.makers: List[Dict[PackKey, int]] = [{} for _ in range(num_workers)]

    def pack_made(self, worker: int, segment: int, keys: Iterable[PackKey]) -> None:
        """Segment ``segment`` made the packs ``keys`` (pooled now)."""
        if self.packs:
            self.makers[worker].update((key, segment) for key in keys)

    def reported(self, worker: int, entry: Entry, pooled: Iterable[PackKey]) -> None:
        """A segment's report: log it, and forget the segments no restore rebuilds from any more."""
        log = self.log[worker]
        log.append(entry)
        start = self.point(worker, pooled)
        if start is None or start == self.base[worker]:
            return
        # (nothing open into the start: the segment before it tells the outputs so far)
        keep_from = start[0] if start[2] is not None else start[0] - 1
        while len(log) > 1 and log[1][0] <= keep_from:
            log.popleft()

    def point(self, worker: int, pooled: Iterable[PackKey]) -> Optional[Tuple[int, ...]]:
        """Where a restore now rebuilds ``worker``'s carry: the segment such that the outputs of the
        batch (or buffer) open at the next segment all come from it on (the next segment itself when
        none is open), or open at the segment that made the oldest of the ``pooled`` packs. ``None``:
        nothing fed since the pass began."""
        log = self.log[worker]
        if not log:
            return self.base[worker]
        into = log[-1][0] + 1
        if self.packs:
            makers = self.makers[worker]
            held = set(pooled) & makers.keys()
            self.makers[worker] = {key: makers[key] for key in held}  # (batched packs forgotten)
            into = min([makers[key] for key in held] + [into])
        return self._into(worker, into)

    def _into(self, worker: int, into: int) -> Tuple[int, ...]:
        log = [entry for entry in self.log[worker] if entry[0] < into]
        if not log:
            return self._base(worker)
        last, before, outputs, tail_from, counts = log[-1]
        if self.packs:
            return self._packs_into(worker, log)
        # the batches counted up to ``into`` (only where nothing but batches is chained: ``into`` is
        # then the segment after the last one reported)
        more = () if counts is None or self.packs else tuple(int(c) for c in counts)
        total = before + outputs
        need = total % self.unit
        if need == 0:
            return (last + 1, total, None, *more)
        covered = 0
        for segment, before, outputs, *_ in reversed(log):
            covered += outputs
            if covered >= need:
                return (segment, before, tail_from, *more)
        base = self._base(worker)  # the open batch reaches back before the restore it started from
        return (*base[:3], *more)

    def _packs_into(self, worker: int, log: List[Entry]) -> Tuple[int, ...]:
        """``_into`` of chained packs: the segment the open buffer starts in, then (where the packing
        hooks are counted) their counts before the segment a restore resumes at (after the last one
        reported) and before the first segment packed again (``restore.ChainedRead``)."""
        resume = self.log[worker][-1][4]
        last, before, outputs, tail_from, counts = log[-1]
        total = before + outputs
        need = total % self.unit
        start: Tuple[Optional[int], ...] = (last + 1, total, None)
        replay = counts
        if need:
            covered = 0
            for segment, seg_before, seg_outputs, _, seg_counts in reversed(log):
                covered += seg_outputs
                if covered >= need:
                    start, replay = (segment, seg_before, tail_from), seg_counts
                    break
            else:  # the open buffer reaches back before the restore the stream started from
                base = self._base(worker)
                start = base[:3]
                replay = tuple(base[7:11]) if len(base) == 11 else ((0, 0, 0, 0) if self.base[worker] is None else None)
        if resume is None or replay is None:
            return start  # type: ignore[return-value]
        return (*start, *(int(c) for c in resume), *(int(c) for c in replay))  # type: ignore[return-value]

    def _base(self, worker: int) -> Tuple[int, ...]:
        """Where the restore the stream started from began, or ``(0, 0, None)``: the stream's start
        with nothing open (``None`` would say there is nothing to rebuild)."""
        base = self.base[worker]
        return (0, 0, None) if base is None else base

    def restored(self, worker: int, chain: Optional[List[Optional[int]]], pooled: Iterable[PackKey]) -> None:
        """``worker`` restored from a checkpoint with ``chain``, its pool holding ``pooled`` packs
        (made from the chain's start on: the restore made them again from there)."""
        self.log[worker].clear()
        self.base[worker] = None if chain is None else tuple(chain)
        made_from = 0 if chain is None else int(chain[0])
        self.makers[worker] = {key: made_from for key in pooled} if self.packs else {}
