"""``FileStoreCachePool``: auxiliary data cached on local disk, shared by the Ray workers of a node.

``get_lazy`` starts a background fetch into the node's cache folder and returns a ``FileCacheLazy``;
``Lazy.get`` waits for it (or fetches now if it has not started) and decodes. Entries stay cached
for every process of the node (later epochs, other workers) until the byte/count budget evicts the
least recently used. The pool and its lazies pickle as their settings, store and name, so they
travel to Ray tasks and back; each process starts its own fetch threads.
"""

from __future__ import annotations

import pickle
import tempfile
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple

from energon_ray.cache.base import CachePool, FileStore, Lazy, add_source_info
from energon_ray.cache.disk import DiskCache
from energon_ray.errors import TRUST_ENV, UntrustedCodeError, resolve_trust
from energon_ray.samples.base import SourceInfo


class _Fetch:
    """One background fetch of ``(store, name)`` and the lazies waiting on it."""

    def __init__(self) -> None:
        self.send_to_cache_future: Optional[Future] = None
        self.refcount = 1


class FileStoreCachePool(CachePool):
    """Caches auxiliary files on local disk for every process of a node.

    Args:
        parent_cache_dir: where the cache folder goes (default: the system temp folder); use the same
            one on every worker of a node (e.g. a local SSD) so they share entries.
        num_workers: background fetch threads per process.
        max_cache_size_gbytes: byte budget of the cache folder (all processes together).
        max_cache_count: file-count budget.
        method: ``"raw"`` caches the stored bytes and decodes on each ``get``; ``"pickle"`` caches the
            decoded value as a pickle, which runs code when loaded: it needs ``trust_dataset_code``.
        trust_dataset_code: opt-in for ``method="pickle"`` (``None``: ``ENERGON_RAY_TRUST_DATASET_CODE``).

    Raises:
        UntrustedCodeError: ``method="pickle"`` without the opt-in.
        ValueError: an unknown method or a negative budget.

    Example:
        >>> import tempfile
        >>> from energon_ray.cache import SystemFileStore
        >>> d = tempfile.mkdtemp(); _ = open(f"{d}/a.txt", "wb").write(b"hi")
        >>> pool = FileStoreCachePool(parent_cache_dir=tempfile.mkdtemp())
        >>> pool.get_lazy(SystemFileStore(d), "a.txt").get()
        b'hi'
        >>> pool.close()
    """

    def __init__(
        self,
        *,
        parent_cache_dir: Optional[Path | str] = None,
        num_workers: int = 8,
        max_cache_size_gbytes: float = 1024,
        max_cache_count: int = 10_000_000,
        method: Literal["raw", "pickle"] = "raw",
        trust_dataset_code: Optional[bool] = None,
    ):
        if method not in ("raw", "pickle"):
            raise ValueError(f"FileStoreCachePool: method must be 'raw' or 'pickle', got {method!r}")
        if method == "pickle" and not resolve_trust(trust_dataset_code):
            raise UntrustedCodeError(
                "FileStoreCachePool(method='pickle') refused: it loads pickles from the cache folder, and "
                "loading a pickle can run code; pass trust_dataset_code=True (or set "
                f"{TRUST_ENV}=1) if you trust every dataset this pool caches, or use method='raw'"
            )
        if max_cache_size_gbytes < 0 or max_cache_count < 0:
            raise ValueError(
                f"FileStoreCachePool: budgets must be >= 0, got max_cache_size_gbytes={max_cache_size_gbytes}, "
                f"max_cache_count={max_cache_count}"
            )
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"FileStoreCachePool: num_workers must be an int >= 1, got {num_workers!r}")
        self.parent_cache_dir = Path(tempfile.gettempdir() if parent_cache_dir is None else parent_cache_dir)
        self.num_workers = num_workers
        self.method = method
        self._disk = DiskCache(self.parent_cache_dir, int(max_cache_size_gbytes * 1024**3), max_cache_count)
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pending: Dict[Tuple[str, str], _Fetch] = {}
        self._closed = False

    # -- pickling: settings travel, threads and pending fetches stay ------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        return {
            "parent_cache_dir": self.parent_cache_dir, "num_workers": self.num_workers, "method": self.method,
            "max_bytes": self._disk.max_bytes, "max_count": self._disk.max_count,
        }  # fmt: skip

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.parent_cache_dir = state["parent_cache_dir"]
        self.num_workers = state["num_workers"]
        self.method = state["method"]
        self._disk = DiskCache(self.parent_cache_dir, state["max_bytes"], state["max_count"])
        self._start()

    # -- budget and usage ---------------------------------------------------------------------------
    @property
    def cache_dir(self) -> Path:
        """The node's cache folder (entries and ``to_cache`` objects)."""
        return self._disk.dir

    @property
    def max_cache_size(self) -> int:
        """Byte budget (settable)."""
        return self._disk.max_bytes

    @max_cache_size.setter
    def max_cache_size(self, value: int) -> None:
        self._disk.max_bytes = int(value)

    @property
    def max_cache_count(self) -> int:
        """Entry-count budget (settable)."""
        return self._disk.max_count

    @max_cache_count.setter
    def max_cache_count(self, value: int) -> None:
        self._disk.max_count = int(value)

    @property
    def current_cache_size(self) -> int:
        """Bytes of the cached entry files now (every process of the node)."""
        return self._disk.usage()[0]

    @property
    def current_cache_count(self) -> int:
        """Entries cached now (every process of the node)."""
        return self._disk.usage()[1]

    # -- reading -------------------------------------------------------------------------------------
    def _key(self, ds: FileStore, fname: str) -> str:
        store = ds.get_path() if self.method == "raw" else ds._cache_identity()
        return f"{self.method}\0{type(ds).__name__ if self.method == 'raw' else ''}\0{store}\0{fname}"

    def _fill(self, ds: FileStore, fname: str) -> Optional[Tuple[bytes, SourceInfo]]:
        """Fetch ``fname`` into the cache unless cached; the stored bytes if this call fetched them."""
        key = self._key(ds, fname)
        if self._disk.read(key) is not None:
            return None
        if self.method == "raw":
            payload, info = ds._get_raw(fname)
        else:
            value, info = ds[fname]
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self._disk.write(key, {"source": _info_to_json(info), "fname": fname}, bytes(payload))
        return bytes(payload), info

    def _decode(self, ds: FileStore, fname: str, payload: bytes) -> Any:
        if self.method == "raw":
            return ds._decode_raw(payload, fname=fname)
        return pickle.loads(payload)

    def _read(self, ds: FileStore, fname: str) -> Tuple[Any, SourceInfo]:
        """The decoded value and source of ``fname``, through the cache."""
        hit = self._disk.read(self._key(ds, fname))
        if hit is not None:
            header, payload = hit
            return self._decode(ds, fname, payload), _info_from_json(header["source"])
        fetched = self._fill(ds, fname)
        if fetched is None:  # another process cached it meanwhile
            return self._read(ds, fname)
        return self._decode(ds, fname, fetched[0]), fetched[1]

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """The decoded data of ``fname`` in ``ds`` now, through the cache; its source goes into ``sample``."""
        data, info = self._read(ds, fname)
        add_source_info(sample, info)
        return data

    def get_lazy(self, ds: FileStore, fname: str) -> "FileCacheLazy":
        """Start fetching ``fname`` into the cache in the background; return the lazy to read it."""
        if not isinstance(ds, FileStore):
            raise TypeError(f"get_lazy: ds must be a FileStore, got {type(ds).__name__}")
        with self._lock:
            if self._closed:
                raise RuntimeError("FileStoreCachePool: get_lazy after close()")
            pending_key = (self._key(ds, fname), fname)
            entry = self._pending.get(pending_key)
            if entry is not None and not entry.send_to_cache_future.cancelled():
                entry.refcount += 1
            else:
                entry = _Fetch()
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.num_workers, thread_name_prefix="energon_ray_cache")
                entry.send_to_cache_future = self._executor.submit(self._fill, ds, fname)
                self._pending[pending_key] = entry
        return FileCacheLazy(ds, fname, self, entry)

    def _release(self, ds: FileStore, fname: str, entry: _Fetch) -> None:
        with self._lock:
            entry.refcount -= 1
            key = (self._key(ds, fname), fname)
            if entry.refcount <= 0 and self._pending.get(key) is entry:
                del self._pending[key]

    def to_cache(self, data: Any, name: str) -> "CacheFileLazy":
        """Park ``data`` in a private file of the cache folder (not evicted); the lazy reads and deletes it.

        Not behind ``trust_dataset_code``: the pickle is the caller's own object, written and read back
        by this process (by uuid name) in a folder only this user can write (``DiskCache`` checks it);
        nothing from a dataset is unpickled here."""
        path = self.cache_dir / f"object-{uuid.uuid4().hex}.pkl"
        path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        return CacheFileLazy(name, self, path)

    def close(self) -> None:
        """Cancel queued fetches and wait for running ones (cached entries stay for other processes)."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __repr__(self) -> str:
        return (
            f"FileStoreCachePool(cache_dir={str(self.cache_dir)!r}, method={self.method!r}, "
            f"max_cache_size={self.max_cache_size}, max_cache_count={self.max_cache_count})"
        )


class FileCacheLazy(Lazy[Any]):
    """A file being fetched into a ``FileStoreCachePool``; ``get`` waits for it and decodes.

    Pickled (e.g. into another Ray task) it carries its store and name, not the fetch: ``get`` on the
    other side reads through that process's pool (the cache folder of its node).
    """

    def __init__(self, ds: FileStore, fname: str, pool: FileStoreCachePool, entry: Optional[_Fetch] = None):
        super().__init__(ds, fname, pool)
        self.entry = entry
        self._data: Optional[Tuple[Any, SourceInfo]] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"ds": self.ds, "fname": self.fname, "pool": self.pool, "_data": self._data}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state, entry=None)

    def get(self, sample: Any = None) -> Any:
        if self._data is None:
            pool: FileStoreCachePool = self.pool
            entry, self.entry = self.entry, None
            try:
                if entry is not None and not entry.send_to_cache_future.cancel():
                    entry.send_to_cache_future.result()  # a failed fetch raises here, naming the file
            finally:
                if entry is not None:
                    pool._release(self.ds, self.fname, entry)
            self._data = pool._read(self.ds, self.fname)
        add_source_info(sample, self._data[1])
        return self._data[0]

    def __del__(self) -> None:
        entry = getattr(self, "entry", None)
        if entry is not None:
            self.entry = None
            try:
                self.pool._release(self.ds, self.fname, entry)
            except Exception:  # interpreter teardown
                pass


class CacheFileLazy(Lazy[Any]):
    """Data parked by ``FileStoreCachePool.to_cache``: the first ``get`` loads and deletes the file.

    Pickled before ``get``, it carries the data itself (the file may be on another node).
    """

    def __init__(self, fname: str, pool: FileStoreCachePool, cache_path: Optional[Path]):
        super().__init__(None, fname, pool)
        self.cache_path = cache_path
        self._loaded = False
        self._data: Any = None

    def _load(self) -> None:
        if not self._loaded:
            assert self.cache_path is not None
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


def _info_to_json(info: Optional[SourceInfo]) -> Optional[Dict[str, Any]]:
    if info is None:
        return None
    return {
        "dataset_path": None if info.dataset_path is None else str(info.dataset_path),
        "index": info.index, "shard_name": None if info.shard_name is None else str(info.shard_name),
        "file_names": list(info.file_names),
    }  # fmt: skip


def _info_from_json(data: Optional[Dict[str, Any]]) -> Optional[SourceInfo]:
    if data is None:
        return None
    return SourceInfo(data["dataset_path"], data["index"], data["shard_name"], tuple(data["file_names"]))
