"""Send an object to Ray tasks as cloudpickle bytes and unpickle it once per worker process."""

from __future__ import annotations

import hashlib
from typing import Any, Dict

import cloudpickle

_CACHE: Dict[str, Any] = {}


class Shipped:
    """A picklable handle whose ``get()`` returns the object, decoded once per process.

    Example:
        >>> Shipped([1, 2]).get()
        [1, 2]
    """

    def __init__(self, obj: Any):
        self.blob = cloudpickle.dumps(obj)
        self.key = hashlib.sha1(self.blob).hexdigest()
        _CACHE.setdefault(self.key, obj)

    def get(self) -> Any:
        obj = _CACHE.get(self.key)
        if obj is None:
            obj = _CACHE[self.key] = cloudpickle.loads(self.blob)
        return obj

    def __getstate__(self) -> Dict[str, Any]:
        return {"blob": self.blob, "key": self.key}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.blob, self.key = state["blob"], state["key"]
