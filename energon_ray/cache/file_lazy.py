"""What a ``FileStoreCachePool`` hands out: a prefetch buffer's entry (``_Prefetch``: one file and
the lazies that reference it) and the lazy itself (``FileCacheLazy``: read once, then released)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from energon_ray.cache.base import FileStore, Lazy, add_source_info
from energon_ray.samples.base import SourceInfo

if TYPE_CHECKING:
    from energon_ray.cache.file_pool import FileStoreCachePool


class _Prefetch:
    """One ``(store, name)`` in a process's prefetch buffer and the lazies that reference it.

    ``send_to_cache_future`` is the queued or running fetch (its result: whether it buffered the
    file); ``data_size`` the payload's bytes once fetched; ``cache_path`` the buffered file."""

    def __init__(self, ds: FileStore, fname: str, key: str):
        self.ds = ds
        self.fname = fname
        self.key = key
        self.send_to_cache_future: Optional[Future] = None
        self.refcount = 1
        self.data_size = 0
        self.require_data_now = False
        self.cache_path: Optional[Path] = None
        self.source_info: Optional[SourceInfo] = None

    def __repr__(self) -> str:
        return f"_Prefetch({self.fname!r}, refcount={self.refcount}, data_size={self.data_size})"


class FileCacheLazy(Lazy[Any]):
    """A file in a ``FileStoreCachePool``'s prefetch buffer; ``get`` reads it (once) and releases it.

    ``entry`` is the shared buffer entry (``refcount``, ``data_size``, ``send_to_cache_future``). A
    lazy dropped before ``get`` releases its reference too. Pickled (e.g. into another Ray task) it
    carries its store and name, not the entry: ``get`` on the other side reads through that process's
    pool (the node cache).
    """

    def __init__(self, ds: FileStore, fname: str, pool: "FileStoreCachePool", entry: Optional[_Prefetch] = None):
        super().__init__(ds, fname, pool)
        self.entry = entry
        self._held = entry is not None
        self._data: Optional[Tuple[Any, SourceInfo]] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"ds": self.ds, "fname": self.fname, "pool": self.pool, "_data": self._data}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state, entry=None, _held=False)

    def get(self, sample: Any = None) -> Any:
        if self._data is None:
            pool: "FileStoreCachePool" = self.pool
            if self._held:
                self._held = False
                self._data = pool._take(self.entry)
            else:
                self._data = pool._read_direct(self.ds, self.fname)
        add_source_info(sample, self._data[1])
        return self._data[0]

    def __del__(self) -> None:
        if getattr(self, "_held", False):
            self._held = False
            try:
                self.pool._drop(self.entry)
            except Exception:  # interpreter teardown
                pass
