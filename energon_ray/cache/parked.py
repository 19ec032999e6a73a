"""``CacheFileLazy``: data a hook parked with ``FileStoreCachePool.to_cache`` (a pickle in the
process's buffer folder, read and deleted once)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Dict, Optional

from energon_ray.cache.base import Lazy


class CacheFileLazy(Lazy[Any]):
    """Data parked by ``FileStoreCachePool.to_cache``: the first ``get`` loads and deletes the file.

    Pickled before ``get``, it carries the data itself (the file may be on another node).
    """

    def __init__(self, fname: str, pool: Any, cache_path: Optional[Path]):
        super().__init__(None, fname, pool)
        self.cache_path = cache_path
        self._loaded = False
        self._data: Any = None

    def _load(self) -> None:
        if not self._loaded:
            if self.cache_path is None:
                raise RuntimeError(f"CacheFileLazy {self.fname!r}: its file is gone")
            self._data = pickle.loads(self.cache_path.read_bytes())
            self._loaded = True
            self.cache_path.unlink(missing_ok=True)
            self.cache_path = None

    def __getstate__(self) -> Dict[str, Any]:
        if not self._loaded and self.cache_path is not None and self.cache_path.is_file():
            data = pickle.loads(self.cache_path.read_bytes())
        else:
            data = self._data
        return {"fname": self.fname, "pool": self.pool, "_data": data}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state, ds=None, cache_path=None, _loaded=True)

    def get(self, sample: Any = None) -> Any:
        self._load()
        return self._data

    def __del__(self) -> None:
        path = getattr(self, "cache_path", None)
        if path is not None:
            self.cache_path = None
            try:
                path.unlink(missing_ok=True)
            except Exception:
                pass

    def __hash__(self) -> int:
        return hash((self.fname, id(self)))

    def __eq__(self, other: Any) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"CacheFileLazy(fname={self.fname!r}, cache_path={self.cache_path!r})"
