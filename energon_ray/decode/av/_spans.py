"""Checked clip ranges turned into the frame and sample numbers a clip covers."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Tuple, Union

from energon_ray.decode.av._ranges import Range, to_ticks
from energon_ray.decode.av._video_index import VideoIndex


def video_span(index: VideoIndex, rng: Range, unit: str) -> Optional[Tuple[int, int]]:
    """Turn a checked range into frame numbers ``(first, last)``; a range that ends past the video
    is cut at its last frame (as Energon cuts it); one that starts at or after the video's end is
    ``None``: no clip (Energon's gives none there either)."""
    start, end = rng
    if unit == "frames":
        if int(start) >= len(index):
            return None
        return int(start), len(index) - 1 if end == math.inf else min(int(end), len(index) - 1)
    ticks_per_second = 1 / index.time_base
    start_ticks = to_ticks(start, ticks_per_second)
    if start_ticks >= index.end_ts:
        return None
    if end == math.inf:
        return index.frame_at(start_ticks), len(index) - 1
    end_ticks = to_ticks(end, ticks_per_second)
    if end_ticks >= index.end_ts:
        return index.frame_at(start_ticks), len(index) - 1
    return index.frame_at(start_ticks), index.frame_at(end_ticks)


def audio_span(rate: int, rng: Range, i: int, unit: str) -> Tuple[int, Optional[int]]:
    """Turn a checked range into sample numbers ``[start, end)`` (``end=None``: to the end; an
    empty range, ``end == start``, is an empty clip as in Energon)."""
    start, end = rng
    if unit == "samples":
        first, stop = int(start), (None if end == math.inf else int(end))
    else:
        # The length comes from the duration, not from rounding the end on its own: every range
        # of the same duration then holds the same number of samples (Energon's count).
        first = round_half_up(to_ticks(start, Fraction(rate)))
        length = None if end == math.inf else round_half_up(to_ticks(end - start, Fraction(rate)))
        stop = None if length is None else first + length
    return first, stop


def round_half_up(ticks: Union[int, Fraction]) -> int:
    """The nearest whole sample, halves up as Energon's ``int(x + 0.5)`` (``round`` takes halves to even)."""
    return math.floor(ticks + Fraction(1, 2))
