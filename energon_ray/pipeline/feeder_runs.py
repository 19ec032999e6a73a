"""The feeder's executions, kept in order (nothing here imports Ray): ``build.Feeder``, the Ray
actor that runs a trainer process's Ray Data executions, is this class with Ray Data set up.

Calls of a threaded actor may start out of order: a ``take`` waits for its turn (the ``seq``-th
bundle of its run), a run closed before its ``submit`` arrived is never registered, and a run closed
while it is being started stops the executor it just started.
"""

from __future__ import annotations

import gc
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional

from energon_ray.ray_env import mark_closed


class _Run:
    """One execution inside the feeder: its Dataset, its bundle iterator, the next take's number.

    ``start`` and ``close`` may run at the same time (threaded actor): a run closed while it was
    being started stops the executor it just started, so no execution outlives its ``close``."""

    def __init__(self, build: Callable[..., Any], build_args: tuple):
        self.build = build
        self.build_args = build_args
        self.bundles: Optional[Iterator[Any]] = None
        self.executor = None
        self.dataset = None
        self.next_seq = 0
        self.done = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.bundles is not None or self.done:
                return
            self.dataset = self.build(*self.build_args[0], **self.build_args[1])
            execute = getattr(self.dataset, "_execute_to_iterator", None)
            if execute is not None:  # Ray 2.60: the executor handle lets close() stop it
                bundles, _, self.executor = execute(capture_executor=False)
            else:  # pragma: no cover - other Ray versions
                bundles = self.dataset.iter_internal_ref_bundles()
            self.bundles = iter(bundles)

    def close(self) -> None:
        with self._lock:
            self.done = True
            executor, self.executor = self.executor, None
            if executor is not None:
                executor.shutdown(force=False)  # cancel its tasks, keep the warm worker processes
            self.bundles = None


class FeederRuns:
    """A feeder's executions by run id: registered by ``submit``, started by their first ``take``,
    stopped by ``close``; ``build`` makes an execution's Ray Dataset (``build.build_dataset``)."""

    def __init__(self, build: Callable[..., Any]) -> None:
        self._build = build
        self._cond = threading.Condition()
        self._runs: Dict[str, _Run] = {}
        # calls of a threaded actor may start out of order: a take can arrive before its submit
        self._closed: Deque[str] = deque(maxlen=4096)
        self._final_stats: Dict[str, str] = {}
        self._submitted = 0  # executions ever registered (never decreases, unlike len(self._runs))

    def submit(self, run_id: str, segments, readers, configs, kwargs: Dict[str, Any]) -> None:
        """Register (not start) an execution; ``take`` starts it. A run closed before its submit
        arrived (calls of a threaded actor may start out of order) is never registered."""
        with self._cond:
            self._submitted += 1
            if run_id in self._closed:
                return
            self._runs[run_id] = _Run(self._build, ((segments, readers, configs), {**kwargs, "run_id": run_id}))
            self._cond.notify_all()

    def take(self, run_id: str, seq: int) -> Optional[List[Any]]:
        """The refs of the ``seq``-th output bundle of a run (``None`` once it is drained)."""
        with self._cond:
            self._cond.wait_for(
                lambda: run_id in self._closed or (run_id in self._runs and self._runs[run_id].next_seq == seq)
            )
            run = self._runs.get(run_id)
        if run is None or run.done:
            self._advance(run, seq)
            return None
        try:
            run.start()
            bundle = next(run.bundles, None)
            if bundle is None:
                run.done = True
                return None
            return [entry.ref for entry in bundle.blocks]
        except Exception:
            if run.done:  # closed while this take waited: nobody reads its answer
                return None
            raise
        finally:
            self._advance(run, seq)

    def _advance(self, run: Optional[_Run], seq: int) -> None:
        with self._cond:
            if run is not None and run.next_seq == seq:
                run.next_seq += 1
            self._cond.notify_all()

    def stats(self, run_id: str) -> str:
        run = self._runs.get(run_id)
        if run is not None and run.dataset is not None:
            return run.dataset.stats()
        return self._final_stats.get(run_id, "")

    def close(self, run_id: str) -> None:
        mark_closed(run_id)  # first: a task Ray starts from now on reads nothing (see mark_closed)
        run = self._runs.get(run_id)
        if run is not None:
            run.close()
            if run.dataset is not None:
                try:  # kept for stats() before the run is forgotten
                    self._final_stats[run_id] = run.dataset.stats()
                except Exception:  # stats are a courtesy; a stopped execution may have none
                    pass
                while len(self._final_stats) > 64:
                    self._final_stats.pop(next(iter(self._final_stats)))
        with self._cond:
            self._runs.pop(run_id, None)
            self._closed.append(run_id)
            self._cond.notify_all()
        if run is not None:
            # a stopped executor's objects form reference cycles that hold block refs (object-store
            # memory) until Python's cyclic GC runs; free them now
            gc.collect()
