"""The one save/restore round-trip check, applied to every stateful stage (as torchdata's nodes do).

``assert_round_trip(make, ks)`` runs a reference iterator once, saving its state before item ``k``
for every ``k`` in ``ks`` (saving must not disturb it); then for each ``k`` a fresh iterator is
restored from that state (after ``transport``, e.g. a JSON round trip) and must yield exactly the
reference's items from ``k`` on, and end where it ended. Each restored iterator is also saved again
after its first item (a restored stage not yet pulled by every worker must save what it was
restored with), and a third iterator restored from that must yield the rest.

``SimLeaf`` is a leaf dataset without Ray: each worker stream's segments are made in-process with the
same row protocol the Ray stages use (items, leftover samples, report), so the driver-side queues,
compositions and round-robin are exercised for every ``k`` in milliseconds.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from energon_ray.blend.base import Composition, PassContext
from energon_ray.loader.merge import EXHAUSTED, NOTHING, Pending, WorkerQueues
from energon_ray.loader.round_robin import RoundRobin
from energon_ray.loader.savable import PassRun, starts_of
from energon_ray.loader.state import STATE_VERSION, LoaderState, StreamState
from energon_ray.pipeline import rows
from energon_ray.worker import WorkerConfig

END = "<end of pass>"


def assert_round_trip(
    make: Callable[[], Any], ks: Iterable[Union[int, str]], *, count: Optional[int] = None, transport: Callable[[Any], Any] = lambda s: s
) -> List[Any]:
    """``make()`` → a fresh object with ``__next__``, ``save()`` and ``restore(state)``.

    A ``k`` below 0 counts from the reference's end (``-1``: before its last item) and ``"mid"`` is
    half its length; with such ``ks`` the reference is saved before every item.
    Returns the reference items (at most ``count``; ``None``: until ``StopIteration``).
    """
    ks = list(ks)
    every = any(k == "mid" or k < 0 for k in ks)
    wanted = sorted({k for k in ks if k != "mid" and k >= 0})
    ref = make()
    items: List[Any] = []
    states: Dict[int, Any] = {}
    while count is None or len(items) < count:
        if every or len(items) in wanted:
            states[len(items)] = transport(ref.save())
        try:
            items.append(next(ref))
        except StopIteration:
            break
    if (every or len(items) in wanted) and len(items) not in states:
        states[len(items)] = transport(ref.save())
    if every:
        wanted = sorted(set(wanted) | {len(items) // 2 if k == "mid" else len(items) + k for k in ks if k == "mid" or k < 0})
        states = {k: states[k] for k in wanted if k in states}
    ended = count is None or len(items) < count
    missing = [k for k in wanted if k not in states]
    if missing:
        raise AssertionError(f"the reference has only {len(items)} items; cannot save after {missing}")
    for k, state in states.items():
        fresh = make()
        fresh.restore(state)
        rest: List[Any] = []
        again = None
        while len(rest) < len(items) - k:
            try:
                rest.append(next(fresh))
            except StopIteration:
                break
            if len(rest) == 1:
                again = transport(fresh.save())
        assert rest == items[k:], f"restored after {k} items: got {rest[:4]}… expected {items[k:k + 4]}…"
        if ended:
            _assert_ends(fresh, f"restored after {k} items")
        if again is not None:
            third = make()
            third.restore(again)
            tail: List[Any] = []
            while len(tail) < len(items) - k - 1:
                try:
                    tail.append(next(third))
                except StopIteration:
                    break
            assert tail == items[k + 1 :], (
                f"restored after {k} items, saved again after 1 more: got {tail[:4]}… expected {items[k + 1:k + 5]}…"
            )
            if ended:
                _assert_ends(third, f"restored after {k} items, saved again after 1 more")
    return items


def _assert_ends(it: Any, what: str) -> None:
    try:
        extra = next(it)
    except StopIteration:
        return
    raise AssertionError(f"{what}: an extra item {extra!r} after the reference's end")


def json_transport(state: Any) -> Any:
    """Through JSON and back, as a checkpoint file would carry it."""
    if state is None:
        return None
    if isinstance(state, LoaderState):
        return LoaderState.from_dict(json.loads(state.to_json()))
    return json.loads(json.dumps(state))


# -- a leaf without Ray ------------------------------------------------------------------------------
class SimLeaf(Composition):
    """A leaf whose worker ``w`` stream is positions ``0..lengths[w]-1``, cut into segments of
    ``segment`` positions. Positions in ``skip`` fail (a segment then leaves its remainder to the
    pool, as on Ray); with ``bucket`` set, samples are grouped by ``bucket(position)`` →
    ``(key, size)`` and batched across segments. A batch is the tuple of its samples' payloads."""

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        name: str = "s",
        segment: int = 4,
        batch_size: Optional[int] = 2,
        skip: Sequence[int] = (),
        bucket: Optional[Callable[[int], tuple]] = None,
        drop_last: bool = False,
        worker_config: Optional[WorkerConfig] = None,
    ):
        self.lengths = list(lengths)
        self.name = name
        self.segment = segment
        self.batch_size = batch_size
        self.skip = set(skip)
        self.bucket = bucket
        self.drop_last = drop_last
        self.worker_config = worker_config or WorkerConfig(rank=0, world_size=1, num_workers=len(lengths))

    def leaves(self) -> List[Any]:
        return [self]

    def is_endless(self) -> bool:
        return False

    def provider(self, ctx: PassContext, pass_index: int):
        return ctx.feeds[id(self)].next_item

    def leaf_shares(self):
        return {id(self): (1.0, 0.0)}

    def __len__(self) -> int:
        return sum(-(-n // (self.batch_size or 1)) for n in self.lengths)

    def payload(self, worker: int, position: int) -> str:
        return f"{self.name}{worker}.{position}"

    def segment_rows(self, worker: int, index: int) -> List[tuple]:
        """The rows the Ray stages would emit for one segment."""
        first, last = index * self.segment, min((index + 1) * self.segment, self.lengths[worker])
        good = [p for p in range(first, last) if p not in self.skip]
        out: List[tuple] = []
        if self.bucket is not None:
            groups = [(*self.bucket(p), [(p, 0, self.payload(worker, p))]) for p in good]
        elif self.batch_size is None:
            out = [(rows.ITEM, worker, index, i, self.payload(worker, p)) for i, p in enumerate(good)]
            groups = []
        else:
            cut = len(good) - len(good) % self.batch_size if len(good) == last - first else 0
            out = [
                (rows.ITEM, worker, index, i, tuple(self.payload(worker, p) for p in good[j : j + self.batch_size]))
                for i, j in enumerate(range(0, cut, self.batch_size))
            ]
            rest = good[cut:]
            groups = [(None, self.batch_size, [(p, 0, self.payload(worker, p)) for p in rest])] if rest else []
        if groups:
            out.append((rows.LEFTOVER, worker, index, len(out), groups))
        report = rows.Report(worker=worker, segment=index, samples_read=last - first, samples_encoded=len(good), batches=len(out), runs=[])
        out.append((rows.REPORT, worker, index, len(out), report))
        return out

    def num_segments(self, worker: int) -> int:
        return -(-self.lengths[worker] // self.segment)


class SimFeed:
    """``LeafFeed`` for a ``SimLeaf``: rows come from the leaf, starting at given segments."""

    def __init__(self, leaf: SimLeaf, source: int, starts: Optional[Sequence[int]] = None):
        self.leaf = leaf
        self.source = source
        self.queues = WorkerQueues(
            len(leaf.lengths), leaf.batch_size, self._batches, drop_last=leaf.drop_last, leaf=source
        )
        self.next_segment = list(starts) if starts is not None else [0] * len(leaf.lengths)
        self.rows: List[List[tuple]] = [[] for _ in leaf.lengths]
        for w in range(len(leaf.lengths)):
            if leaf.num_segments(w) == 0:
                self.queues.close_worker(w)

    @staticmethod
    def _batches(worker: int, groups) -> List[Any]:
        return [Pending(lambda groups=groups: [tuple(payload for _, _, payload in group) for _, group in groups])]

    def _pull(self, worker: int) -> bool:
        if not self.rows[worker]:
            index = self.next_segment[worker]
            if index >= self.leaf.num_segments(worker):
                return False
            self.next_segment[worker] += 1
            self.rows[worker] = self.leaf.segment_rows(worker, index)
        row = self.rows[worker].pop(0)
        self.queues.feed(row, row[0] == rows.REPORT and row[2] == self.leaf.num_segments(row[1]) - 1)
        return True

    def next_item(self, worker: int) -> Any:
        while True:
            item = self.queues.pop(worker)
            if item is not NOTHING:
                return item
            if self.queues.done[worker]:
                return EXHAUSTED
            if not self._pull(worker):
                if not self.queues.done[worker]:
                    self.queues.close_worker(worker)



class SimMulti:
    """The part of ``MultiFeed`` a ``PassRun`` uses: the feeds, and re-making pooled samples."""

    def __init__(self, feeds: List[SimFeed], leaves: List[SimLeaf]):
        self.feeds, self.leaves = feeds, leaves

    def reread(self, streams: Sequence[Sequence[StreamState]]) -> Dict[tuple, Any]:
        out = {}
        for per_worker in streams:
            for worker, state in enumerate(per_worker):
                for leaf, position, sub in state.checkpoint.refs():
                    out[(worker, leaf, position, sub)] = self.leaves[leaf].payload(worker, position)
        return out


class SimLoader:
    """A composition of ``SimLeaf``s iterated like ``EnergonLoader`` iterates one pass, saved and
    restored by the loader's own ``PassRun``."""

    def __init__(self, composition: Composition):
        self.composition = composition
        self.leaves: List[SimLeaf] = composition.leaves()
        self._build(None)

    def _build(self, starts: Optional[List[List[int]]]) -> None:
        feeds = [SimFeed(leaf, i, None if starts is None else starts[i]) for i, leaf in enumerate(self.leaves)]
        ctx = PassContext({id(leaf): feed for leaf, feed in zip(self.leaves, feeds)}, stats=None)
        provider = self.composition.provider(ctx, 0)
        rr = RoundRobin(self.composition.num_workers, provider, caps=self.composition.caps())
        self.run = PassRun(0, SimMulti(feeds, self.leaves), ctx, rr)

    def __next__(self) -> Any:
        return next(self.run.round_robin)

    def save(self) -> LoaderState:
        blank = LoaderState(
            version=STATE_VERSION, rank=0, world_size=1, num_workers=self.composition.num_workers, fingerprint="sim", passes=1
        )
        return self.run.save(blank)

    def restore(self, state: LoaderState) -> None:
        self._build(starts_of(state))
        self.run.restore(state)
