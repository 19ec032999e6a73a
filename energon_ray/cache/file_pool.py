"""``FileStoreCachePool``: auxiliary files prefetched to local disk (Energon's prefetch buffer),
read through a cache that the Ray workers of a node share.

Two layers:

- The prefetch buffer of a process (Energon's semantics). ``get_lazy`` queues a background fetch of
  ``(store, name)``; the lazies of one file share one entry and count references. Fetches wait, in
  the order queued, while the buffer's byte/count budget is full. A lazy's ``get`` reads the
  buffered file, or reads directly when its fetch has not started or is waiting for room (the fetch
  is then queued again for the other references). The file is deleted once every reference has read
  it or was dropped, so the buffer holds what is yet to be read, never more than its budget.
- The node cache: every fetch reads through ``parent_cache_dir/energon_ray_cache``, which every
  process of the node shares, so a file another Ray worker of the node or an earlier epoch fetched
  is not fetched again. It keeps entries until its own budget evicts the least recently used. A
  buffered file is a hard link of its node-cache entry where it can be (no second copy).

One pool per process: a pool pickled into Ray tasks becomes, in each worker process, that process's
pool of the same settings (its own buffer folder and fetch threads), shared by the tasks the process
runs, as Energon's pool is per DataLoader worker.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple

from energon_ray.cache.base import CachePool, FileStore, add_source_info
from energon_ray.cache.disk import DiskCache, entry_header, info_from_json, link_or_write, process_dir, read_entry_file
from energon_ray.cache.file_lazy import FileCacheLazy, _Prefetch
from energon_ray.cache.parked import CacheFileLazy
from energon_ray.cache.process_pools import register, registered, unregister
from energon_ray.errors import TRUST_ENV, UntrustedCodeError, resolve_trust
from energon_ray.samples.base import SourceInfo

class FileStoreCachePool(CachePool):
    """Prefetches auxiliary files to local disk, through a cache the processes of a node share.

    Args:
        parent_cache_dir: where the folders go (default: the system temp folder); give every worker of
            a node the same one (e.g. a local SSD) so they share the node cache.
        num_workers: background fetch threads per process.
        max_cache_size_gbytes: byte budget of a process's prefetch buffer: fetches wait while it is
            full (``max_cache_size`` in bytes, settable).
        max_cache_count: file-count budget of the prefetch buffer (settable).
        method: ``"raw"`` caches the stored bytes and decodes on each ``get``; ``"pickle"`` caches the
            decoded value as a pickle, which runs code when loaded: it needs ``trust_dataset_code``.
        trust_dataset_code: opt-in for ``method="pickle"`` (``None``: ``ENERGON_RAY_TRUST_DATASET_CODE``).
        node_cache_gbytes: byte budget of the node cache (all processes together; least recently used
            entries are evicted beyond it); ``None``: as ``max_cache_size_gbytes``; ``0``: no node cache.
        node_cache_count: entry-count budget of the node cache (``None``: as ``max_cache_count``).

    Raises:
        UntrustedCodeError: ``method="pickle"`` without the opt-in.
        ValueError: an unknown method or a negative budget.

    Example:
        >>> import tempfile
        >>> from energon_ray.cache import SystemFileStore
        >>> d = tempfile.mkdtemp(); _ = open(f"{d}/a.txt", "wb").write(b"hi")
        >>> pool = FileStoreCachePool(parent_cache_dir=tempfile.mkdtemp())
        >>> lazy = pool.get_lazy(SystemFileStore(d), "a.txt")
        >>> lazy.get(), lazy.entry.refcount, pool.current_cache_count, pool.node_cache_count
        (b'hi', 0, 0, 1)
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
        node_cache_gbytes: Optional[float] = None,
        node_cache_count: Optional[int] = None,
    ):
        if method not in ("raw", "pickle"):
            raise ValueError(f"FileStoreCachePool: method must be 'raw' or 'pickle', got {method!r}")
        if method == "pickle" and not resolve_trust(trust_dataset_code):
            raise UntrustedCodeError(
                "FileStoreCachePool(method='pickle') refused: it loads pickles from the cache folder, and "
                "loading a pickle can run code; pass trust_dataset_code=True (or set "
                f"{TRUST_ENV}=1) if you trust every dataset this pool caches, or use method='raw'"
            )
        node_cache_gbytes = max_cache_size_gbytes if node_cache_gbytes is None else node_cache_gbytes
        node_cache_count = max_cache_count if node_cache_count is None else node_cache_count
        budgets = {
            "max_cache_size_gbytes": max_cache_size_gbytes, "max_cache_count": max_cache_count,
            "node_cache_gbytes": node_cache_gbytes, "node_cache_count": node_cache_count,
        }  # fmt: skip
        for name, value in budgets.items():
            if value < 0:
                raise ValueError(f"FileStoreCachePool: {name} must be >= 0, got {value}")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"FileStoreCachePool: num_workers must be an int >= 1, got {num_workers!r}")
        settings = {
            "parent_cache_dir": Path(tempfile.gettempdir() if parent_cache_dir is None else parent_cache_dir),
            "num_workers": num_workers, "method": method,
            "max_cache_size": int(max_cache_size_gbytes * 1024**3), "max_cache_count": int(max_cache_count),
            "node_bytes": int(node_cache_gbytes * 1024**3), "node_count": int(node_cache_count),
        }  # fmt: skip
        self._setup(uuid.uuid4().hex, settings)

    def _setup(self, token: str, settings: Dict[str, Any]) -> None:
        self._token = token
        self.parent_cache_dir: Path = settings["parent_cache_dir"]
        self.num_workers: int = settings["num_workers"]
        self.method: str = settings["method"]
        #: the prefetch buffer's budgets (settable) and usage
        self.max_cache_size: int = settings["max_cache_size"]
        self.max_cache_count: int = settings["max_cache_count"]
        self.current_cache_size = 0
        self.current_cache_count = 0
        node_on = settings["node_bytes"] > 0 and settings["node_count"] > 0
        self._node = (
            DiskCache(self.parent_cache_dir, settings["node_bytes"], settings["node_count"]) if node_on else None
        )
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)  # notified when buffer room frees or a reader waits
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pending: Dict[str, _Prefetch] = {}  # by key (which names the file)
        self._closed = False
        self._cache_dir: Optional[Path] = None  # made on first use (``cache_dir``)
        register(token, self)

    # -- one pool per process -----------------------------------------------------------------------
    def _settings(self) -> Dict[str, Any]:
        return {
            "parent_cache_dir": self.parent_cache_dir, "num_workers": self.num_workers, "method": self.method,
            "max_cache_size": self.max_cache_size, "max_cache_count": self.max_cache_count,
            "node_bytes": 0 if self._node is None else self._node.max_bytes,
            "node_count": 0 if self._node is None else self._node.max_count,
        }  # fmt: skip

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_process_pool, (self._token, self._settings()))

    @property
    def cache_dir(self) -> Path:
        """This process's prefetch buffer folder (and ``to_cache`` objects); removed when the process exits."""
        with self._lock:
            if self._cache_dir is None:
                self._cache_dir = process_dir(self.parent_cache_dir, "energon_ray_prefetch")
                weakref.finalize(self, shutil.rmtree, self._cache_dir, True)
            return self._cache_dir

    # -- the node cache -----------------------------------------------------------------------------
    @property
    def node_cache_dir(self) -> Optional[Path]:
        """The node cache's folder (``None`` when ``node_cache_gbytes=0``)."""
        return None if self._node is None else self._node.dir

    @property
    def node_cache_max_size(self) -> int:
        """Byte budget of the node cache (settable)."""
        return 0 if self._node is None else self._node.max_bytes

    @node_cache_max_size.setter
    def node_cache_max_size(self, value: int) -> None:
        if self._node is None:
            raise ValueError("FileStoreCachePool: this pool has no node cache (node_cache_gbytes=0)")
        self._node.max_bytes = int(value)

    @property
    def node_cache_size(self) -> int:
        """Bytes of the node cache's entry files now (every process of the node)."""
        return 0 if self._node is None else self._node.usage()[0]

    @property
    def node_cache_count(self) -> int:
        """Entries in the node cache now (every process of the node)."""
        return 0 if self._node is None else self._node.usage()[1]

    # -- reading -------------------------------------------------------------------------------------
    def _key(self, ds: FileStore, fname: str) -> str:
        store = ds.get_path() if self.method == "raw" else ds._cache_identity()
        return f"{self.method}\0{type(ds).__name__ if self.method == 'raw' else ''}\0{store}\0{fname}"

    def _fetch(self, ds: FileStore, fname: str, key: str) -> Tuple[bytes, SourceInfo, Optional[Path]]:
        """The payload of ``fname`` and its source, through the node cache; the node-cache file if any."""
        if self._node is not None:
            hit = self._node.read(key)
            if hit is not None:
                return hit[1], info_from_json(hit[0]["source"]), self._node.path_of(key)
        if self.method == "raw":
            payload, info = ds._get_raw(fname)
        else:
            value, info = ds[fname]
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        payload = bytes(payload)
        node_file = None
        if self._node is not None and self._node.write(key, entry_header(info, fname), payload):
            node_file = self._node.path_of(key)
        return payload, info, node_file

    def _decode(self, ds: FileStore, fname: str, payload: bytes) -> Any:
        if self.method == "raw":
            return ds._decode_raw(payload, fname=fname)
        return pickle.loads(payload)

    def _read_direct(self, ds: FileStore, fname: str) -> Tuple[Any, SourceInfo]:
        payload, info, _ = self._fetch(ds, fname, self._key(ds, fname))
        return self._decode(ds, fname, payload), info

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """The decoded data of ``fname`` in ``ds`` now (through the node cache, not the prefetch buffer);
        its source goes into ``sample``."""
        data, info = self._read_direct(ds, fname)
        add_source_info(sample, info)
        return data

    # -- the prefetch buffer ------------------------------------------------------------------------
    def get_lazy(self, ds: FileStore, fname: str) -> "FileCacheLazy":
        """Queue a background fetch of ``fname`` into the prefetch buffer; the lazy reads it.

        Lazies of the same file share one fetch and one buffered file (``lazy.entry.refcount``)."""
        if not isinstance(ds, FileStore):
            raise TypeError(f"get_lazy: ds must be a FileStore, got {type(ds).__name__}")
        key = self._key(ds, fname)
        with self._lock:
            if self._closed:
                raise RuntimeError("FileStoreCachePool: get_lazy after close()")
            entry = self._pending.get(key)
            if entry is not None:
                entry.refcount += 1
            else:
                entry = self._pending[key] = _Prefetch(ds, fname, key)
                self._queue(entry)
        return FileCacheLazy(ds, fname, self, entry)

    def _queue(self, entry: _Prefetch) -> None:
        """Queue ``entry``'s fetch (holding the lock)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.num_workers, thread_name_prefix="energon_ray_cache")
        entry.send_to_cache_future = self._executor.submit(self._prefetch, entry)

    def _fits(self, size: int) -> bool:
        return self.current_cache_count + 1 <= self.max_cache_count and self.current_cache_size + size <= self.max_cache_size

    def _prefetch(self, entry: _Prefetch) -> bool:
        """Background: fetch ``entry``, wait for room in the buffer, write it; whether it is buffered."""
        with self._lock:
            if self._closed or entry.refcount <= 0:
                return False
        payload, info, node_file = self._fetch(entry.ds, entry.fname, entry.key)
        with self._lock:
            entry.data_size, entry.source_info = len(payload), info
            if entry.data_size > self.max_cache_size or self.max_cache_count < 1:
                return False  # can never fit: readers read directly
            while not self._fits(entry.data_size):
                self._space.wait()
                if entry.require_data_now or self._closed:
                    return False  # a reader reads directly (and queues this again for the others)
            if entry.refcount <= 0:
                return False
            self.current_cache_size += entry.data_size
            self.current_cache_count += 1
        path = self.cache_dir / DiskCache.entry_name(entry.key)
        try:
            link_or_write(path, node_file, DiskCache.pack(entry.key, entry_header(info, entry.fname), payload))
        except BaseException:
            with self._lock:
                self._unreserve(entry.data_size)
            raise
        with self._lock:
            if entry.refcount <= 0 or self._closed:  # every reference dropped meanwhile
                self._unreserve(entry.data_size)
                path.unlink(missing_ok=True)
                return False
            entry.cache_path = path
        return True

    def _unreserve(self, size: int) -> None:
        self.current_cache_size -= size
        self.current_cache_count -= 1
        self._space.notify_all()

    def _take(self, entry: _Prefetch) -> Tuple[Any, SourceInfo]:
        """A lazy's read: from the buffer if its fetch buffered it, else directly; releases the reference."""
        with self._lock:
            started = not entry.send_to_cache_future.cancel()
            if started:
                entry.require_data_now = True
                self._space.notify_all()
        buffered = failed = False
        try:
            try:
                buffered = started and entry.send_to_cache_future.result()
            except BaseException:
                failed = True  # the fetch's error (naming the file) goes to every reference
                raise
            if buffered:
                _, payload = read_entry_file(entry.cache_path, entry.key)
                return self._decode(entry.ds, entry.fname, payload), entry.source_info
            return self._read_direct(entry.ds, entry.fname)
        finally:
            with self._lock:
                entry.require_data_now = False
                self._release(entry)
                if entry.refcount > 0 and not buffered and not failed and not self._closed:
                    self._queue(entry)  # the other references still want it buffered

    def _release(self, entry: _Prefetch) -> None:
        """Drop one reference (holding the lock); the last one removes the entry and its file."""
        entry.refcount -= 1
        if entry.refcount > 0:
            return
        if self._pending.get(entry.key) is entry:
            del self._pending[entry.key]
        if entry.send_to_cache_future is not None:
            entry.send_to_cache_future.cancel()
        if entry.cache_path is not None:
            entry.cache_path.unlink(missing_ok=True)
            entry.cache_path = None
            self._unreserve(entry.data_size)

    def _drop(self, entry: _Prefetch) -> None:
        with self._lock:
            self._release(entry)

    def to_cache(self, data: Any, name: str) -> "CacheFileLazy":
        """Park ``data`` in a file of this process's buffer folder (outside the budget); the lazy reads
        and deletes it.

        Not behind ``trust_dataset_code``: the pickle is the caller's own object, written and read back
        by this process (by uuid name) in a folder only this user can write; nothing from a dataset
        is unpickled here."""
        path = self.cache_dir / f"object-{uuid.uuid4().hex}.pkl"
        path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        return CacheFileLazy(name, self, path)

    def close(self) -> None:
        """Cancel queued fetches, wake waiting ones and wait for running ones. Files buffered for lazies
        not yet read stay until they are read (the folder goes when the process exits); the node
        cache stays for other processes."""
        with self._lock:
            self._closed = True
            for entry in list(self._pending.values()):
                if entry.send_to_cache_future is not None:
                    entry.send_to_cache_future.cancel()
            self._space.notify_all()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._pending.clear()
        unregister(self._token, self)

    def __repr__(self) -> str:
        return (
            f"FileStoreCachePool(cache_dir={None if self._cache_dir is None else str(self._cache_dir)!r}, method={self.method!r}, "
            f"max_cache_size={self.max_cache_size}, max_cache_count={self.max_cache_count}, "
            f"current_cache_size={self.current_cache_size}, current_cache_count={self.current_cache_count}, "
            f"node_cache_dir={None if self._node is None else str(self._node.dir)!r})"
        )


def _process_pool(token: str, settings: Dict[str, Any]) -> FileStoreCachePool:
    """This process's pool for ``token`` (an unpickled pool): the existing one, or a new one."""
    pool = registered(token)
    if pool is not None:
        return pool
    pool = FileStoreCachePool.__new__(FileStoreCachePool)
    pool._setup(token, settings)
    return pool

