"""The Ray Data executor's block stream (``executor="ray_data"``): the output blocks of an
execution that the feeder actor runs, in order, as zero-copy Arrow tables (``BlockStream``), and
how many of a pass's first segments run as plain tasks meanwhile (``task_segments``).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Deque, Iterator

import pyarrow as pa

from energon_ray.pipeline import build
from energon_ray.pipeline.shipped import ship, ship_each
from energon_ray.pipeline.streams import new_id


def task_segments(window: int) -> int:
    """With the Ray Data executor: how many segments of a pass's first window (``window`` long) run
    as plain Ray tasks: half the window, at most 32 (the rest is the feeder's Ray Data execution,
    which starts meanwhile); ``ENERGON_RAY_START_WITH_TASKS=0`` turns this off."""
    if os.environ.get("ENERGON_RAY_START_WITH_TASKS", "1").strip().lower() in ("0", "false", "no"):
        return 0
    return max(0, min(32, window // 2))


class BlockStream:
    """The output blocks of one execution (run by the feeder), in order, as zero-copy Arrow tables.

    ``prefetch`` ``take`` calls stay in flight; their blocks are pulled to this node as soon as the
    references arrive. ``close()`` stops the execution (an abandoned iteration frees its Ray tasks
    and object-store memory).
    """

    #: the next window's execution starts when this one is drained (the feeder runs one at a time)
    starts_next_early = False

    def __init__(self, segments, readers, configs, prefetch: int = 4, **kwargs: Any):
        self.run_id = new_id("r")
        self.feeder = build.feeder()
        # pickled here, unpickled only by the Ray tasks: the feeder never imports the task encoder
        self.feeder.submit.remote(self.run_id, segments, ship_each(readers), ship(configs), kwargs)
        self.prefetch = max(1, prefetch)
        self._calls: Deque[Any] = deque()
        self._blocks: Deque[Any] = deque()
        self._seq = 0
        self._drained = False
        self.start()

    def start(self) -> None:
        """Keep ``prefetch`` takes in flight (the first ones start the execution)."""
        while not self._drained and len(self._calls) < self.prefetch:
            self._calls.append(self.feeder.take.remote(self.run_id, self._seq))
            self._seq += 1

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        while not self._blocks:
            if not self._calls:
                raise StopIteration
            refs = build.get(self._calls.popleft())
            if refs is None:
                self._drained = True
                self._calls.clear()
                raise StopIteration
            build.pull(refs)
            self._blocks.extend(refs)
            self.start()
        self.last_ref = self._blocks.popleft()
        return build.get(self.last_ref)

    def ready(self) -> bool:
        """Whether the next block is here already (taking it waits for nothing)."""
        return bool(self._blocks) and build.finished(self._blocks[0])

    def stats(self) -> str:
        """Ray Data's per-operator stats of this execution."""
        return build.values(self.feeder.stats.remote(self.run_id))

    def close(self) -> None:
        self._calls.clear()
        self._blocks.clear()
        self._drained = True
        if not build.running():  # Ray was shut down (its executions with it); never start it again
            return
        try:
            self.feeder.close.remote(self.run_id)
        except Exception:  # Ray is shutting down: nothing left to stop
            pass
