"""What a worker's queue needs to be saved and restored, in positions only (``merge.WorkerQueues``).

Every event that can queue items (a segment's rows, the previous dataset's remainder, the end of
the stream) is recorded with a ``QueueCheckpoint`` of the worker's pools, and each queued entry is
tagged with its event and its samples' stream positions. A save takes the checkpoint of the oldest
entry not yet consumed and how many of that event's items were; a restore replays that event and
drops those items (``skip``). No Ray, no payloads.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from energon_ray.loader.state import QueueCheckpoint, StreamState, expand_ranges, to_ranges


class QueueLog:
    """Per worker: the event tag and samples' positions of each queued entry (parallel to the
    queue), each event's ``[checkpoint, items consumed, their positions]``, and what a restore left
    to do (items to drop, the restored state until the next event)."""

    def __init__(self, num_workers: int):
        #: per worker: the event tag of each queued entry
        self.tags: List[Deque[int]] = [deque() for _ in range(num_workers)]
        #: per worker: the stream positions of each queued entry's samples
        self.spans: List[Deque[List[int]]] = [deque() for _ in range(num_workers)]
        #: per worker: tag → [checkpoint, items consumed from that event, their samples' positions]
        self.records: List[Dict[int, list]] = [{} for _ in range(num_workers)]
        #: per worker: the tag of the latest event
        self.current = [-1] * num_workers
        #: per worker: items to drop at the next pops (a restore's consumed items)
        self.skip = [0] * num_workers
        #: per worker: the restored ``StreamState`` until the first event after the restore
        self.restored: List[Optional[StreamState]] = [None] * num_workers
        self._tag = 0

    def event(self, worker: int, checkpoint: QueueCheckpoint, queue_empty: bool) -> None:
        """A new event of ``worker`` with the checkpoint before it; the items it queues get its tag.
        Once the queue is empty, older events have nothing left to save."""
        tag, self._tag = self._tag, self._tag + 1
        records = self.records[worker]
        if queue_empty:
            records.clear()
        consumed, positions = 0, []
        restored, self.restored[worker] = self.restored[worker], None
        if restored is not None:  # the restored event's consumed items count on
            consumed, positions = restored.consumed, expand_ranges(restored.positions)
        records[tag] = [checkpoint, consumed, positions]
        self.current[worker] = tag

    def queued(self, worker: int, spans: List[List[int]]) -> None:
        """Entries appended to ``worker``'s queue under the current event, with their samples' positions."""
        self.tags[worker].extend([self.current[worker]] * len(spans))
        self.spans[worker].extend(spans)

    def take(self, worker: int) -> Tuple[int, List[int]]:
        """The tag and positions of the entry popped from the front of ``worker``'s queue."""
        return self.tags[worker].popleft(), self.spans[worker].popleft()

    def put_back(self, worker: int, tag: int, spans: List[List[int]]) -> None:
        """Entries put back at the front of the queue (a seam batch's items, in order), under ``tag``."""
        self.tags[worker].extendleft([tag] * len(spans))
        self.spans[worker].extendleft(reversed(spans))

    def consumed(self, worker: int, tag: int, span: List[int]) -> None:
        """An item of event ``tag`` was given to the consumer; events before it are forgotten."""
        records = self.records[worker]
        records[tag][1] += 1
        records[tag][2].extend(span)
        while True:  # events before this one have nothing left in the queue
            oldest = next(iter(records))
            if oldest >= tag:
                break
            del records[oldest]

    def checkpoint_of(self, worker: int, tag: int) -> Optional[QueueCheckpoint]:
        record = self.records[worker].get(tag)
        return None if record is None else record[0]

    def saved(self, worker: int, feeding: bool) -> Optional[StreamState]:
        """``worker``'s state: the restored one until its next event, else the checkpoint of the
        oldest queued entry's event (or of the half-fed segment's, ``feeding``: it is fed again),
        with its consumed items; ``None``: nothing queued or half fed (the caller's checkpoint of now)."""
        if self.restored[worker] is not None:
            return self.restored[worker]
        if self.tags[worker]:
            tag = self.tags[worker][0]
        elif feeding:
            tag = self.current[worker]
        else:
            return None
        checkpoint, consumed, positions = self.records[worker][tag]
        return StreamState(checkpoint, consumed, to_ranges(positions))

    def saved_segment(self, worker: int, feeding: bool) -> Optional[int]:
        """``saved(worker, feeding).checkpoint.segment`` without building the state."""
        if self.restored[worker] is not None:
            return self.restored[worker].checkpoint.segment
        if self.tags[worker]:
            return self.records[worker][self.tags[worker][0]][0].segment
        if feeding:
            return self.records[worker][self.current[worker]][0].segment
        return None

    def restore(self, worker: int, state: StreamState) -> None:
        """Forget ``worker``'s entries and events; drop ``state.consumed`` items at the next pops."""
        self.tags[worker].clear()
        self.spans[worker].clear()
        self.records[worker].clear()
        self.skip[worker] = state.consumed
        self.restored[worker] = state
