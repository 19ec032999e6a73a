"""``get_loader``'s own keywords checked before anything is built, each error naming the keyword as
its caller spelt it (``prefetch_batches`` for ``get_loader``, ``loader.prefetch_batches`` for the
training config), so a wrong value never reaches a Ray call that would fail far from it.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional


def check_prefetch_batches(value: Any, name: str = "prefetch_batches") -> int:
    """``value`` as a whole number of batches ≥ 0.

    Raises:
        ValueError: naming ``name`` and the value.

    Example:
        >>> check_prefetch_batches(4)
        4
        >>> check_prefetch_batches("x", name="loader.prefetch_batches")
        Traceback (most recent call last):
        ...
        ValueError: loader.prefetch_batches must be a whole number >= 0, got 'x'
    """
    if not _is_whole(value) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return int(value)


def check_object_store_limit(value: Any, name: str = "object_store_limit") -> Optional[int]:
    """``value`` as bytes ≥ 0, or ``None`` (Ray's default).

    Raises:
        ValueError: naming ``name`` and the value (``"1GiB"``: give the bytes, ``1073741824``).
    """
    if value is None:
        return None
    if not _is_whole(value) or value < 0:
        raise ValueError(f"{name} must be a whole number of bytes >= 0 (or null), got {value!r}")
    return int(value)


def check_pin_memory(value: Any, name: str = "pin_memory") -> Optional[bool]:
    """``value`` as ``True``, ``False`` or ``None`` (pin when CUDA is available).

    Raises:
        TypeError: naming ``name`` and the value.
    """
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool or None, got {value!r}")
    return value


def _is_whole(value: Any) -> bool:
    """An int, or a float without a fraction (``1e9``); never a flag."""
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())
