"""Runs of sample indices: which consecutive samples one read of a shard's bytes can cover.

Pure functions of indices and ``.tar.idx`` offsets (no I/O): :mod:`energon_ray.source.reader`
reads a segment's samples with as few requests of a shard as they allow.
"""

from __future__ import annotations

from typing import Iterator, List, Sequence, Tuple

import numpy as np


def sorted_runs(indices: Sequence[int]) -> List[Tuple[int, int]]:
    """The distinct values of ``indices`` as sorted runs of consecutive values ``(first, last)``.

    Example:
        >>> sorted_runs([9, 3, 4, 10, 2, 4])
        [(2, 4), (9, 10)]
    """
    values = np.unique(np.asarray(indices, dtype=np.int64))
    if not len(values):
        return []
    breaks = np.flatnonzero(np.diff(values) != 1)
    firsts = np.concatenate([[0], breaks + 1])
    lasts = np.concatenate([breaks, [len(values) - 1]])
    return [(int(values[a]), int(values[b])) for a, b in zip(firsts, lasts)]


def merge_close_runs(runs: Sequence[Tuple[int, int]], offsets: np.ndarray, max_gap: int) -> List[Tuple[int, int]]:
    """Join sorted runs whose byte gap (the samples between them) is at most ``max_gap`` bytes: one
    request then reads the gap too, instead of a request per run (0: only touching runs join).

    Example:
        >>> merge_close_runs([(0, 1), (3, 3), (9, 9)], np.arange(0, 1100, 100), max_gap=100)
        [(0, 3), (9, 9)]
    """
    out: List[Tuple[int, int]] = []
    for first, last in runs:
        if out and int(offsets[first]) - int(offsets[out[-1][1] + 1]) <= max_gap:
            out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def consecutive_runs(indices: Sequence[int]) -> Iterator[Tuple[int, int, int]]:
    """Split positions of ``indices`` into runs of consecutive values: ``(pos, first, last)``.

    Example:
        >>> list(consecutive_runs([3, 4, 5, 9, 10, 2]))
        [(0, 3, 5), (3, 9, 10), (5, 2, 2)]
    """
    pos = 0
    n = len(indices)
    while pos < n:
        first = last = int(indices[pos])
        end = pos + 1
        while end < n and int(indices[end]) == last + 1:
            last += 1
            end += 1
        yield pos, first, last
        pos = end
