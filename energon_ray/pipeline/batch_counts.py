"""A worker stream's batch counts as Energon's batch hooks read them (no Ray imports): ``Made``
counts a group's batches on from the stream's counts before it; ``MADE`` marks them in a batch's
restore key, from which ``restore_sample`` counts on again.
"""

from __future__ import annotations

from typing import List, Optional, Tuple


#: right before the samples' keys (after ``(BATCH, batch index)`` and any ``(BATCHED, i, j)``), where
#: the batch hooks read counts other than the group's index (``Made``): ``(MADE, outputs of batch,
#: batches given, *the samples' keys)`` before the group, which ``restore_sample`` counts on from
#: again (a key without it: every call read the group's index)
MADE = "Made"


class Made:
    """Where a group's batches stand in their worker stream (``Batcher``): the group's ``index``, the
    ``outputs`` of ``batch`` (calls of ``encode_batch``) and the ``batches`` given before, counted on
    in ``counts`` (``[outputs, batches]``, the caller's list). ``counts`` ``None``: flat, every call
    reads ``index`` and nothing is counted."""

    __slots__ = ("index", "counts", "start")

    def __init__(self, index: int, counts: Optional[List[int]]):
        self.index = index
        self.counts = counts
        self.start = (index, index) if counts is None else (int(counts[0]), int(counts[1]))

    @property
    def outputs(self) -> int:
        return self.index if self.counts is None else self.counts[0]

    @property
    def batches(self) -> int:
        return self.index if self.counts is None else self.counts[1]

    def encoded(self) -> None:
        """An output of ``batch`` went through ``encode_batch`` (or needs none)."""
        if self.counts is not None:
            self.counts[0] += 1

    def given(self, n: int) -> None:
        """``n`` batches were given."""
        if self.counts is not None:
            self.counts[1] += n

    def key(self, several: bool) -> Optional[Tuple[int, int]]:
        """What a batch key holds after the index (``MADE``): the counts before the group, where a
        call read other values than the group's index (a generator's outputs always: a key without
        them is from before they were counted, whose calls all read the index)."""
        if self.counts is None or (not several and self.start == (self.index, self.index)):
            return None
        return self.start
