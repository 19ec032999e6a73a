"""What each segment's report added to a source's counters and failure runs, per worker stream.

A report is counted as its block arrives (``LoaderStats.account``), a seam-batch task's when the
consumer reaches its batches (``WorkerQueues.pop``). When Ray loses an execution, the loader runs
each worker stream again from its checkpoint's segment (``MultiFeed._recover``): the segments from
there report again, and the seam batches their rows pool are made (and report) again.
``ReportLedger.take_back`` first takes back what they added (``loader.stats``' counters and
``seam_batches``; the runs of consecutive failures, which would otherwise count them twice and
raise a ``FatalSampleError`` early), so every segment and every seam batch is counted once.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, NamedTuple, Sequence, Tuple

from energon_ray.loader.stats import Counts, LoaderStats
from energon_ray.pipeline.policy import FailureChain

Runs = Dict[Tuple[int, str], int]


class Entry(NamedTuple):
    """What was counted for a segment: its report's, or a seam task's reports and batches."""

    #: the segment whose making again makes this again (a seam task: its queueing event's checkpoint segment)
    segment: int
    #: when it was counted (a worker's runs are put back to the earliest entry's ``runs_before``)
    order: int
    counts: Tuple[Counts, ...]
    #: the worker's open failure runs before it was counted
    runs_before: Runs
    seam_batches: int = 0


class ReportLedger:
    """Per worker stream, what was counted and is not yet behind its checkpoint, in counting order."""

    def __init__(self, num_workers: int) -> None:
        self._entries: List[List[Entry]] = [[] for _ in range(num_workers)]
        self._order = itertools.count()

    def note(self, worker: int, segment: int, counts: Counts, runs_before: Runs) -> None:
        """Segment ``segment`` of ``worker`` was counted: ``counts``, after the runs ``runs_before``."""
        self._entries[worker].append(Entry(segment, next(self._order), (counts,), runs_before))

    def note_seams(self, worker: int, segment: int, counts: Sequence[Counts], runs_before: Runs, batches: int) -> None:
        """A seam task queued at checkpoint segment ``segment`` of ``worker`` was counted: its reports'
        ``counts`` and ``batches`` made, after the runs ``runs_before``."""
        self._entries[worker].append(Entry(segment, next(self._order), tuple(counts), runs_before, batches))

    def forget_before(self, worker: int, segment: int) -> None:
        """What segments before ``segment`` (the checkpoint's) added is never made again: forget it."""
        self._entries[worker] = [e for e in self._entries[worker] if e.segment >= segment]

    def take_back(self, worker: int, segment: int, stats: LoaderStats, chain: FailureChain) -> None:
        """``worker``'s stream runs again from ``segment``: take back what its segments from there (and
        the seam tasks they queued) added to ``stats``, and put its failure runs back to what they
        were before the first of them was counted."""
        again = [e for e in self._entries[worker] if e.segment >= segment]
        if not again:
            return
        for entry in again:
            for counts in entry.counts:
                stats.add_counts(counts, sign=-1)
            stats.seam_batches -= entry.seam_batches
        chain.put_runs(worker, min(again, key=lambda e: e.order).runs_before)
        self._entries[worker] = [e for e in self._entries[worker] if e.segment < segment]
