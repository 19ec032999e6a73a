"""The order in which segments of several leaf datasets are handed to one Ray execution.

Every segment gets a *need key*: the blend step at which its first item is expected to be taken,
``offset + start / positions_per_item / share`` (``start``: its first stream position; ``share``: the
leaf's expected fraction of a worker's items; ``offset``: steps before the leaf starts, for
concatenations). Merging the leaves' segment
streams by ``(key, worker, leaf)`` gives Ray one task list in roughly the order the loader consumes
items, so one execution feeds all sources and none runs far ahead of its share. The keys only
decide *when work is scheduled*; the loader's output order comes from the composition and never
depends on this estimate.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from energon_ray.plan.stream import SegmentPlan, SegmentSpec


#: ``need(worker, item_index) -> step``: when the composition will take that item of a leaf.
NeedFn = Callable[[int, int], float]


@dataclasses.dataclass(frozen=True)
class LeafSchedule:
    """How one leaf's segments are spread over the consumer's steps.

    ``need`` (exact, from the composition's own seeded draws) wins over the ``share``/``offset``
    estimate when the composition can provide it.
    """

    plan: SegmentPlan
    share: float
    offset: float
    #: stream positions per item (the batch size of a batched leaf)
    positions_per_item: float
    need: Optional[NeedFn] = None
    #: First segment of each worker (a restored loader resumes there); ``None``: all from 0.
    starts: Optional[Tuple[int, ...]] = None

    def key(self, index: int, worker: int = 0) -> float:
        items = self.plan.layout.start(index) / self.positions_per_item
        if self.need is not None:
            return self.need(worker, int(items))
        return self.offset + items / max(self.share, 1e-9)


def _worker_segments(leaf: LeafSchedule, leaf_index: int, worker: int) -> Iterator[Tuple[float, int, int, SegmentSpec]]:
    rounds: Optional[int] = leaf.plan.num_segments(worker)
    r = 0 if leaf.starts is None else leaf.starts[worker]
    while rounds is None or r < rounds:
        spec = leaf.plan.segment(worker, r)
        if spec is None:
            return
        yield leaf.key(r, worker), worker, leaf_index, spec
        r += 1


def merged_segments(leaves: Sequence[LeafSchedule]) -> Iterator[SegmentSpec]:
    """All segments of all leaves, by need key (then worker, then leaf); each (leaf, worker)
    stream keeps its own order.

    Example:
        >>> from energon_ray.plan.stream import StreamConfig, WorkerStream
        >>> def plan(n, source):
        ...     cfg = StreamConfig(worker=0, global_worker=0, seed=1, offsets=(0, n), training=False, repeat=False)
        ...     return SegmentPlan([WorkerStream(cfg)], 2, source=source)
        >>> specs = merged_segments([LeafSchedule(plan(8, 0), 0.75, 0, 1), LeafSchedule(plan(4, 1), 0.25, 0, 1)])
        >>> [(s.source, s.index) for s in specs]
        [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3), (1, 1)]
    """
    streams = [
        _worker_segments(leaf, i, w) for i, leaf in enumerate(leaves) for w in range(len(leaf.plan.streams))
    ]
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
