"""Checking clip ranges, units and output sizes given by the user (pure Python, no PyAV)."""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

VIDEO_UNITS = ("seconds", "frames")
AUDIO_UNITS = ("seconds", "samples")

#: A requested position, converted to the stream's ticks, that lies this close to a whole tick is
#: snapped to it: 0.3 s is 3071.9999999999995 ticks of 1/10240 s in floating point.
_SNAP_TICKS = 1e-6

Range = Tuple[float, float]


def check_unit(unit: Any, allowed: Sequence[str], what: str, key: str) -> str:
    """Return ``unit`` if it is one of ``allowed``.

    Raises:
        ValueError: naming the sample key, the stream kind and the value received.
    """
    if unit not in allowed:
        raise ValueError(f"{key}: {what}_unit={unit!r} is not one of {list(allowed)}")
    return unit


def range_list(ranges: Any, *, what: str, key: str) -> List[Any]:
    """The user's clip ranges as a list, read once: any iterable of pairs, as Energon iterates them
    (a list of tuples, a numpy array or torch tensor of shape ``(n, 2)``, a generator).

    Array rows become Python lists (``.tolist()``), so ``np.array([[0.5, 1.0]])`` is checked and
    reported as ``[0.5, 1.0]``.

    Raises:
        ValueError: for a string, bytes, a mapping or an object that cannot be iterated.

    Example:
        >>> range_list(iter([(0, 1)]), what="video", key="s.mp4")
        [(0, 1)]
    """
    if isinstance(ranges, (str, bytes, Mapping)) or not isinstance(ranges, Iterable):
        raise ValueError(
            f"{key}: {what}_clip_ranges must be a sequence of (start, end) pairs, got {ranges!r}"
        )
    return [r.tolist() if callable(getattr(r, "tolist", None)) else r for r in ranges]


def check_ranges(ranges: Any, *, what: str, unit: str, key: str) -> List[Range]:
    """Validate ``[(start, end), ...]`` clip ranges and return them as float pairs.

    ``end`` may be ``float("inf")`` (until the end of the stream). With ``unit`` ``"frames"`` or
    ``"samples"`` both ends must be whole numbers.

    Args:
        ranges: the user's ``(start, end)`` pairs, as :func:`range_list` returns them.
        what: ``"video"`` or ``"audio"``, for messages.
        unit: the already checked unit.
        key: the sample key, for messages.

    Returns:
        The ranges as ``(float, float)`` tuples.

    Raises:
        ValueError: for a malformed, negative, non-finite, reversed or (in counted units) fractional range.
    """
    return [_check_range(r, i, what=what, unit=unit, key=key) for i, r in enumerate(ranges)]


def _check_range(rng: Any, i: int, *, what: str, unit: str, key: str) -> Range:
    where = f"{key}: {what} clip #{i} {rng!r} ({unit})"
    try:
        start, end = rng
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a (start, end) pair") from None
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where}: {name} must be a number, got {type(value).__name__}")
    start, end = float(start), float(end)
    if math.isnan(start) or math.isnan(end) or math.isinf(start) or end == -math.inf:
        raise ValueError(f"{where}: start must be finite and end finite or +inf")
    if start < 0:
        raise ValueError(f"{where}: negative start")
    if end < start:
        raise ValueError(f"{where}: start is after end")
    counted = unit in ("frames", "samples")
    if counted and (not start.is_integer() or not (end.is_integer() or end == math.inf)):
        raise ValueError(f"{where}: positions in {unit} must be whole numbers")
    return start, end


def check_frame_size(size: Any, key: str) -> Optional[Tuple[int, int]]:
    """Validate ``video_out_frame_size``: ``None`` or ``(width, height)`` positive integers.

    Raises:
        ValueError: naming the sample key and the value received.
    """
    if size is None:
        return None
    try:
        width, height = size
    except (TypeError, ValueError):
        raise ValueError(f"{key}: video_out_frame_size must be (width, height), got {size!r}") from None
    for value in (width, height):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(
                f"{key}: video_out_frame_size must be two positive integers (width, height), got {size!r}"
            )
    return int(width), int(height)


def to_ticks(seconds: float, ticks_per_second: Fraction) -> Union[int, Fraction]:
    """Convert a finite position in seconds to ticks, snapping float noise onto whole ticks.

    Example:
        >>> to_ticks(0.3, Fraction(10240))
        3072
    """
    exact = Fraction(seconds) * ticks_per_second
    nearest = round(exact)
    return nearest if abs(exact - nearest) < _SNAP_TICKS else exact
