"""What each segment's report added to a source's counters and failure runs, per worker stream.

A report is counted as its block arrives (``LoaderStats.account``). When Ray loses an execution,
the loader runs each worker stream again from its checkpoint's segment (``MultiFeed._recover``), and
the segments from there report again: ``ReportLedger.take_back`` first takes back what they added
(``loader.stats``' counters; the runs of consecutive failures, which would otherwise count them
twice and raise a ``FatalSampleError`` early), so every segment is counted once.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from energon_ray.loader.stats import Counts, LoaderStats
from energon_ray.pipeline.policy import FailureChain

#: a counted segment: what it added, and its worker's open failure runs before it
Entry = Tuple[Counts, Dict[Tuple[int, str], int]]


class ReportLedger:
    """Per worker stream, the segments counted and not yet behind its checkpoint, in stream order."""

    def __init__(self, num_workers: int) -> None:
        self._entries: List[Dict[int, Entry]] = [{} for _ in range(num_workers)]

    def note(self, worker: int, segment: int, counts: Counts, runs_before: Dict[Tuple[int, str], int]) -> None:
        """Segment ``segment`` of ``worker`` was counted: ``counts``, after the runs ``runs_before``."""
        self._entries[worker][segment] = (counts, runs_before)

    def forget_before(self, worker: int, segment: int) -> None:
        """Segments before ``segment`` (the checkpoint's) are never made again: forget them."""
        entries = self._entries[worker]
        for old in [s for s in entries if s < segment]:
            del entries[old]

    def take_back(self, worker: int, segment: int, stats: LoaderStats, chain: FailureChain) -> None:
        """``worker``'s stream runs again from ``segment``: take back what its segments from there added
        to ``stats``, and put its failure runs back to what they were before them."""
        entries = self._entries[worker]
        again = sorted(s for s in entries if s >= segment)
        if not again:
            return
        for s in again:
            stats.add_counts(entries[s][0], sign=-1)
        chain.put_runs(worker, entries[again[0]][1])
        for s in again:
            del entries[s]
