"""The order of worker streams: item by item, as a torch ``DataLoader`` interleaves its workers."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

from energon_ray.loader.merge import EXHAUSTED
from energon_ray.loader.state import RoundRobinState, StateError
from energon_ray.loader.stats import LoaderStats


class RoundRobin:
    """Interleave workers item by item, like a torch ``DataLoader`` interleaves its worker processes;
    ``next_item(w)`` returns an item or ``EXHAUSTED``; a finished (or capped) worker drops out.

    Example:
        >>> streams = {0: iter("ab"), 1: iter("x")}
        >>> list(RoundRobin(2, lambda w: next(streams[w], EXHAUSTED)))
        ['a', 'x', 'b']
    """

    def __init__(
        self,
        num_workers: int,
        next_item: Callable[[int], Any],
        *,
        caps: Optional[Sequence[int]] = None,
        start_worker: int = 0,
        stats: Optional[LoaderStats] = None,
    ):
        self.num_workers = num_workers
        self.next_item = next_item
        self.caps = caps
        self.stats = stats
        self.active = [True] * num_workers
        self.emitted = [0] * num_workers
        self.worker = start_worker % max(1, num_workers)

    def __iter__(self) -> "RoundRobin":
        return self

    def __next__(self) -> Any:
        while any(self.active):
            w = self.worker
            if self.active[w] and self.caps is not None and self.emitted[w] >= self.caps[w]:
                self.active[w] = False
            if self.active[w]:
                item = self.next_item(w)
                if item is EXHAUSTED:
                    self.active[w] = False
                else:
                    self.emitted[w] += 1
                    if self.stats is not None:
                        self.stats.batches += 1
                    self.worker = (w + 1) % self.num_workers
                    return item
            self.worker = (w + 1) % self.num_workers
        raise StopIteration

    def state(self) -> RoundRobinState:
        return RoundRobinState(self.worker, list(self.emitted), list(self.active))

    def restore(self, state: RoundRobinState) -> None:
        if len(state.emitted) != self.num_workers:
            raise StateError(f"the state has {len(state.emitted)} worker streams, this loader {self.num_workers}")
        self.worker, self.emitted, self.active = state.next_worker, list(state.emitted), list(state.active)


def round_robin(
    num_workers: int,
    next_item: Callable[[int], Any],
    *,
    caps: Optional[Sequence[int]] = None,
    start_worker: int = 0,
    stats: Optional[LoaderStats] = None,
) -> Iterator[Any]:
    """``RoundRobin`` as a plain iterator.

    Example:
        >>> streams = {0: iter("ab"), 1: iter("x")}
        >>> list(round_robin(2, lambda w: next(streams[w], EXHAUSTED)))
        ['a', 'x', 'b']
    """
    return RoundRobin(num_workers, next_item, caps=caps, start_worker=start_worker, stats=stats)
