"""``NoCachePool``: reads on demand and keeps nothing; ``DirectLazy`` defers the read to ``get``."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from energon_ray.cache.base import CachePool, FileStore, Lazy, MockLazy, add_source_info
from energon_ray.samples.base import SourceInfo


class DirectLazy(Lazy[Any]):
    """Reads ``ds[fname]`` at the first ``get`` (and keeps it for later calls)."""

    def __init__(self, ds: FileStore, fname: str, pool: Any = None):
        super().__init__(ds, fname, pool)
        self._data: Optional[Tuple[Any, SourceInfo]] = None

    def get(self, sample: Any = None) -> Any:
        if self._data is None:
            assert self.ds is not None
            self._data = self.ds[self.fname]
        add_source_info(sample, self._data[1])
        return self._data[0]


class NoCachePool(CachePool):
    """A pool that caches nothing: ``get`` reads now, ``get_lazy`` reads at ``Lazy.get``.

    Example:
        >>> NoCachePool().to_cache([1, 2], "x").get()
        [1, 2]
    """

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        return ds.get(fname, sample)

    def get_lazy(self, ds: FileStore, fname: str) -> DirectLazy:
        return DirectLazy(ds, fname, self)

    def to_cache(self, data: Any, name: str) -> Lazy:
        return MockLazy(name, _Constant(data))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "NoCachePool()"


class _Constant:
    """A picklable ``lambda _: data``."""

    def __init__(self, data: Any):
        self.data = data

    def __call__(self, _name: str) -> Any:
        return self.data
