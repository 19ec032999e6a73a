"""The order in which segments of several leaf datasets are handed to one Ray execution.

Every segment gets a *need key*: the blend step at which its first item is expected to be taken,
``offset + index * items_per_segment / share`` (``share``: the leaf's expected fraction of a worker's
items; ``offset``: steps before the leaf starts, for concatenations). Merging the leaves' segment
streams by ``(key, worker, leaf)`` gives Ray one task list in roughly the order the loader consumes
items, so one execution feeds all sources and none runs far ahead of its share. The keys only
decide *when work is scheduled*; the loader's output order comes from the composition and never
depends on this estimate.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Iterator, List, Optional, Sequence, Tuple

from energon_ray.plan.stream import SegmentPlan, SegmentSpec


@dataclasses.dataclass(frozen=True)
class LeafSchedule:
    """How one leaf's segments are spread over the consumer's steps."""

    plan: SegmentPlan
    share: float
    offset: float
    items_per_segment: float

    def key(self, index: int) -> float:
        return self.offset + index * self.items_per_segment / max(self.share, 1e-9)


def _leaf_segments(leaf: LeafSchedule, leaf_index: int) -> Iterator[Tuple[float, int, int, SegmentSpec]]:
    rounds: Optional[int] = leaf.plan.num_rounds
    r = 0
    while rounds is None or r < rounds:
        found = False
        for w in range(len(leaf.plan.streams)):
            spec = leaf.plan.segment(w, r)
            if spec is not None:
                found = True
                yield leaf.key(r), w, leaf_index, spec
        if not found and rounds is None:
            return  # an endless plan with empty streams
        r += 1


def merged_segments(leaves: Sequence[LeafSchedule]) -> Iterator[SegmentSpec]:
    """All segments of all leaves, by need key (then worker, then leaf).

    Example:
        >>> from energon_ray.plan.stream import StreamConfig, WorkerStream
        >>> def plan(n, source):
        ...     cfg = StreamConfig(worker=0, global_worker=0, seed=1, offsets=(0, n), training=False, repeat=False)
        ...     return SegmentPlan([WorkerStream(cfg)], 2, source=source)
        >>> specs = merged_segments([LeafSchedule(plan(8, 0), 0.75, 0, 2), LeafSchedule(plan(4, 1), 0.25, 0, 2)])
        >>> [(s.source, s.index) for s in specs]
        [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3), (1, 1)]
    """
    streams = [_leaf_segments(leaf, i) for i, leaf in enumerate(leaves)]
    for _, _, _, spec in heapq.merge(*streams, key=lambda entry: entry[:3]):
        yield spec


def windows(leaves: Sequence[LeafSchedule], size: int, first: Optional[int] = None) -> Iterator[List[SegmentSpec]]:
    """The merged segments cut into lists: the first of ``first``, then growing 4x up to ``size``
    (a quick first batch, few Ray executions later on)."""
    current: List[SegmentSpec] = []
    limit = first or size
    for spec in merged_segments(leaves):
        current.append(spec)
        if len(current) >= limit:
            yield current
            current, limit = [], min(size, limit * 4)
    if current:
        yield current
