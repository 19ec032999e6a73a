"""Save and restore of ``merge.WorkerQueues``: its per-worker checkpoints, in positions only.

``QueueSaving`` is the part of ``WorkerQueues`` that records a ``QueueCheckpoint`` at each event
that can queue items (``queue_log.QueueLog`` tags the items with it), says where a worker's stream
stands (``state``) and puts it back there from re-read samples (``restore``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from energon_ray.loader.state import QueueCheckpoint, SampleRef, StreamState


class QueueSaving:
    """``WorkerQueues``' checkpoints, state and restore (a mixin: it reads and sets the queues'
    per-worker fields, and replays their ``carry_in``/``close_worker`` events)."""

    def _event(self, worker: int, event: str, carried: Optional[list] = None) -> None:
        self.log.event(worker, self._checkpoint(worker, event, carried or []), not self.queues[worker])

    def chain_point(self, worker: int) -> Optional[Tuple[int, ...]]:
        """Where a chained stream restored now rebuilds its carry (``ChainPoints.point``); ``None``:
        not chained, or nothing fed since the pass began."""
        return None if self.chains is None else self.chains.point(worker, self._pooled(worker))

    def _pooled(self, worker: int) -> List[Tuple[int, int]]:
        return [(item[0], item[1]) for _, items in self.pools[worker].values() for item in items]

    def _checkpoint(self, worker: int, event: str, carried: list) -> QueueCheckpoint:
        chain = self.chain_point(worker)
        return QueueCheckpoint(
            event=event,
            segment=self.next_segment[worker],
            pools=pool_refs(self.pools[worker]),
            held=[(key, size, (item[3], item[0], item[1])) for key, size, item in self.held[worker]],
            waiting=self.waiting[worker],
            done=self.done[worker],
            carried=carried,
            chain=None if chain is None else list(chain),
            groups_made=self.groups_made[worker],  # (0 where nothing counts groups)
        )

    def _checkpoint_segment(self, worker: int) -> int:
        """``state(worker).checkpoint.segment`` without building the checkpoint: where a restore now
        would make ``worker``'s stream again from."""
        segment = None if self.hand_out else self.log.saved_segment(worker, self.feeding[worker] is not None)
        return self.next_segment[worker] if segment is None else segment

    def state(self, worker: int) -> StreamState:
        """Where ``worker``'s stream stands: the checkpoint of its oldest unconsumed item (or of now)."""
        # with hand_out: the pool now and the segment to feed next (a half-fed one is fed again)
        saved = None if self.hand_out else self.log.saved(worker, self.feeding[worker] is not None)
        return StreamState(self._checkpoint(worker, "feed", []), 0) if saved is None else saved

    def restore(self, worker: int, state: StreamState, payloads: Dict[Tuple[int, int, int, int], Any]) -> None:
        """Put ``worker``'s stream where ``state`` says: pools from ``payloads`` (re-read samples by
        ``(worker, leaf, position, sub)``), the checkpoint's event replayed, its consumed items to be dropped."""
        cp = state.checkpoint
        self.ledger.take_back(worker, cp.segment, self.stats, self.chain)

        def item(ref: SampleRef) -> Tuple[int, int, Any, int]:
            leaf, position, sub = ref
            return position, sub, payloads[(worker, leaf, position, sub)], leaf

        self.queues[worker].clear()
        self.log.restore(worker, state)
        self.pools[worker] = {key: (size, [item(r) for r in refs]) for key, size, refs in cp.pools}
        self.held[worker] = [(key, size, item(ref)) for key, size, ref in cp.held]
        self.waiting[worker] = cp.waiting
        self.done[worker] = cp.done
        self.next_segment[worker] = cp.segment
        self.feeding[worker] = None
        self.staged[worker] = []
        if self.chains is not None:
            self.chains.restored(worker, cp.chain, [(p, s) for _, _, refs in cp.pools for _, p, s in refs])
        if self.counts_restored[worker]:  # a later leaf of the chain: a checkpoint of now holds a count
            # of groups made ahead, where the oldest one (the replay starts there) holds the count then
            self.groups_made[worker] = min(self.groups_made[worker], cp.groups_made)
        else:
            self.groups_made[worker], self.counts_restored[worker] = cp.groups_made, True
        if cp.event == "carry":
            self.carry_in(worker, {key: (size, [item(r) for r in refs]) for key, size, refs in cp.carried})
        elif cp.event == "close":
            self.close_worker(worker)


def pool_refs(pools: Dict[Any, Tuple[int, List[Any]]]) -> List[Tuple[Any, int, List[SampleRef]]]:
    """A worker's pools as positions: ``(bucket key, size, [(leaf, position, sub), ...])``."""
    return [(key, size, [(item[3], item[0], item[1]) for item in items]) for key, (size, items) in pools.items()]
