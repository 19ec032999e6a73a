"""An object pickled where it is made and unpickled only where it is used.

The feeder actor plans Ray Data executions of readers and task-encoder stages it never runs: it
passes them on as ``Shipped`` bytes, so its process imports neither torch nor the user's task
encoder module (seconds of a cold first batch). Each Ray task unpickles its own fresh copy, as Ray
does for a task's arguments, so no state is shared between tasks. The bytes are always made by the
loader's own process from objects its caller passed in; nothing a dataset brings is unpickled here.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, Mapping

import cloudpickle


class Shipped:
    """``obj`` as cloudpickle bytes; :meth:`get` returns a fresh copy of it."""

    __slots__ = ("data",)

    def __init__(self, obj: Any):
        self.data = cloudpickle.dumps(obj, protocol=5)

    def get(self) -> Any:
        return pickle.loads(self.data)

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Shipped({len(self.data)} bytes)"


def ship(obj: Any) -> Shipped:
    """``obj`` wrapped once (a ``Shipped`` is passed through)."""
    return obj if isinstance(obj, Shipped) else Shipped(obj)


def ship_each(readers: Any) -> Dict[int, Shipped]:
    """One ``Shipped`` per source: a mapping ``{source: reader}``, or one reader as source 0."""
    if not isinstance(readers, Mapping):
        readers = {0: readers}
    return {source: ship(reader) for source, reader in readers.items()}


def unship(obj: Any) -> Any:
    """The object itself: unpickled from a ``Shipped``, anything else as is."""
    return obj.get() if isinstance(obj, Shipped) else obj
