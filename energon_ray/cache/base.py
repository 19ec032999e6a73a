"""The contracts of auxiliary data: ``FileStore`` (media by name), ``Lazy`` (a deferred fetch) and
``CachePool`` (where fetched media wait), plus ``PrimaryFileStore`` and ``MockLazy``.

Everything here crosses Ray task boundaries by pickling: a store carries the path it reads (and
opens its files again on the other side), a lazy carries its store and name, never an open handle.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Generic, Optional, Tuple, TypeVar

from energon_ray.samples.base import SourceInfo

T = TypeVar("T")


def add_source_info(sample: Any, *infos: SourceInfo) -> None:
    """Record where auxiliary data came from in ``sample["__sources__"]`` / ``sample.__sources__``.

    A list is appended to; a tuple or ``None`` is replaced by a longer tuple; ``sample=None`` is a no-op.

    Example:
        >>> s = {"__sources__": ()}
        >>> add_source_info(s, SourceInfo("ds", 0, "a.tar", ("0.txt",)))
        >>> len(s["__sources__"])
        1
    """
    infos = tuple(i for i in infos if i is not None)
    if sample is None or not infos:
        return
    if isinstance(sample, dict):
        old = sample.get("__sources__")
        if isinstance(old, list):
            old.extend(infos)
        else:
            sample["__sources__"] = tuple(old or ()) + infos
        return
    old = getattr(sample, "__sources__", None)
    if isinstance(old, list):
        old.extend(infos)
    else:
        object.__setattr__(sample, "__sources__", tuple(old or ()) + infos)


class FileStore(abc.ABC, Generic[T]):
    """Random access to files by name (a prepared dataset by ``key.part``, or a folder by path).

    Subclasses implement ``__getitem__`` (→ ``(data, SourceInfo)``) and ``get_path``.
    """

    @abc.abstractmethod
    def __getitem__(self, key: str) -> Tuple[T, SourceInfo]:
        """The data stored under ``key`` and where it came from."""

    @abc.abstractmethod
    def get_path(self) -> str:
        """The store's location (its identity in caches and messages)."""

    def get(self, key: str, sample: Any = None) -> T:
        """The data under ``key``; its ``SourceInfo`` is added to ``sample`` (if given)."""
        data, info = self[key]
        add_source_info(sample, info)
        return data

    def _get_raw(self, key: str) -> Tuple[bytes, SourceInfo]:
        """The stored bytes under ``key``, not decoded (a wrapper decodes in ``_decode_raw``)."""
        return self[key]  # type: ignore[return-value]

    def _decode_raw(self, data: Any, **kwargs: Any) -> Any:
        """Turn what ``_get_raw`` returned into what ``__getitem__`` returns (identity here)."""
        return data

    def _cache_identity(self) -> str:
        """What distinguishes this store's *decoded* values in a shared cache (path + decoding)."""
        return f"{type(self).__name__}({self.get_path()})"

    def get_media_metadata(self, key: str) -> Any:
        """The stored media metadata (``ImageMetadata``/``AVMetadata``) of file ``key``.

        Raises:
            NotImplementedError: in stores without a media metadata index (all but ``DatasetFileStore``).
        """
        raise NotImplementedError(f"{type(self).__name__}({self.get_path()}) does not store media metadata")


class PathStore(FileStore[bytes]):
    """A store that its ``path`` stands for: it pickles as the path alone and opens again where it
    is unpickled (a Ray worker), so its open files, connections and caches stay behind."""

    path: Any

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def get_path(self) -> str:
        return str(self.path)


class FileStoreWrapper(FileStore[T]):
    """A store that forwards to ``inner`` (subclasses decode or rewrite keys)."""

    def __init__(self, inner: FileStore):
        if not isinstance(inner, FileStore):
            raise TypeError(f"{type(self).__name__}: inner must be a FileStore, got {type(inner).__name__}")
        self._inner = inner

    def get_path(self) -> str:
        return self._inner.get_path()

    def _get_raw(self, key: str) -> Tuple[bytes, SourceInfo]:
        return self._inner._get_raw(key)

    def _decode_raw(self, data: Any, **kwargs: Any) -> Any:
        return self._inner._decode_raw(data, **kwargs)

    def _cache_identity(self) -> str:
        return self._inner._cache_identity()

    def get_media_metadata(self, key: str) -> Any:
        return self._inner.get_media_metadata(key)


class PrimaryFileStore(FileStoreWrapper[T]):
    """The sample's own dataset: a key starting with ``.`` is taken relative to the current sample
    (``".jpg"`` of sample ``"000042"`` reads ``"000042.jpg"``)."""

    def __init__(self, inner: FileStore[T], current_key: str):
        super().__init__(inner)
        self._current_key = current_key

    def _full(self, key: str) -> str:
        return f"{self._current_key}{key}" if key.startswith(".") else key

    def __getitem__(self, key: str) -> Tuple[T, SourceInfo]:
        return self._inner[self._full(key)]

    def get(self, key: str, sample: Any = None) -> T:
        return self._inner.get(self._full(key), sample)

    def _get_raw(self, key: str) -> Tuple[bytes, SourceInfo]:
        return self._inner._get_raw(self._full(key))

    def get_media_metadata(self, key: str) -> Any:
        return self._inner.get_media_metadata(self._full(key))

    def __repr__(self) -> str:
        return f"PrimaryFileStore({self._inner!r}, current_key={self._current_key!r})"


class FileStoreDecoder(abc.ABC):
    """Decodes one file's bytes by its name (the extension picks the decoder), like ``SampleDecoder.decode``."""

    @abc.abstractmethod
    def decode(self, fname: str, data: bytes) -> Any:
        """The decoded value of file ``fname`` holding ``data``."""


class Lazy(abc.ABC, Generic[T]):
    """A reference to data not fetched yet: ``get(sample)`` fetches it (once) and records its source.

    Attributes:
        ds: the store (``None`` for data handed to ``CachePool.to_cache``).
        fname: the name in the store.
        pool: the pool that made it.
    """

    ds: Optional[FileStore]
    fname: str
    pool: Any

    def __init__(self, ds: Optional[FileStore], fname: str, pool: Any):
        self.ds = ds
        self.fname = fname
        self.pool = pool

    @abc.abstractmethod
    def get(self, sample: Any = None) -> T:
        """Fetch now (or return what an earlier call fetched) and add the source info to ``sample``."""

    def _store_id(self) -> Optional[str]:
        return None if self.ds is None else self.ds.get_path()

    def __hash__(self) -> int:
        return hash((self._store_id(), self.fname))

    def __eq__(self, other: Any) -> bool:
        # the store's path, not its object: equal lazies stay equal after a trip through pickle
        return isinstance(other, Lazy) and (self._store_id(), self.fname) == (other._store_id(), other.fname)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ds={self._store_id()!r}, fname={self.fname!r})"


class MockLazy(Lazy[T]):
    """A ``Lazy`` whose data comes from ``get_fn(fname)`` (tests, or data made by a function).

    Example:
        >>> MockLazy("a.txt", lambda name: name.upper()).get()
        'A.TXT'
    """

    def __init__(self, fname: str, get_fn: Callable[[str], T]):
        super().__init__(None, fname, None)
        self.get_fn = get_fn

    def get(self, sample: Any = None) -> T:
        return self.get_fn(self.fname)

    def __hash__(self) -> int:
        return hash((self.fname, self.get_fn))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MockLazy) and (self.fname, self.get_fn) == (other.fname, other.get_fn)

    def __repr__(self) -> str:
        return f"MockLazy(fname={self.fname!r}, get_fn={self.get_fn!r})"


class CachePool(abc.ABC):
    """Where fetched auxiliary data waits until a hook needs it.

    ``get`` fetches now; ``get_lazy`` returns a ``Lazy`` (the pool may fetch it in the background);
    ``to_cache`` parks data the hook already has and returns a ``Lazy`` to it.
    """

    @abc.abstractmethod
    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """The data of ``fname`` in ``ds``; its source info is added to ``sample``."""

    @abc.abstractmethod
    def get_lazy(self, ds: FileStore, fname: str) -> Lazy:
        """A lazy reference to ``fname`` in ``ds``."""

    @abc.abstractmethod
    def to_cache(self, data: Any, name: str) -> Lazy:
        """Park ``data`` (``name`` is for messages) and return a lazy that gives it back."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop background work and release what the pool holds in this process."""
