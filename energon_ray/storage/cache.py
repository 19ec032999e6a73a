"""An optional on-disk cache of whole remote shards per node, with a byte budget (least recently used
shards are evicted first). Off unless ``ENERGON_RAY_SHARD_CACHE_BYTES`` is set where the dataset is
opened; worth it when a dataset is read for several epochs.

The first read of a shard on a node downloads it whole (one streamed request) into the cache folder;
later reads of any process on that node are local ``pread`` calls. Files are written under a temporary
name and renamed, so concurrent processes never see half a shard; a shard larger than the budget is
never cached (it is read with ranged requests as without a cache).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import tempfile
import uuid
from typing import Callable, Optional

from energon_ray.storage.errors import StorageError

BYTES_ENV = "ENERGON_RAY_SHARD_CACHE_BYTES"
DIR_ENV = "ENERGON_RAY_SHARD_CACHE_DIR"


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Where the shard cache lives on each node and how many bytes it may hold."""

    directory: str
    max_bytes: int

    @classmethod
    def from_environment(cls) -> Optional["CacheConfig"]:
        """``ENERGON_RAY_SHARD_CACHE_BYTES`` (e.g. ``50e9``; unset or 0: no cache) and
        ``ENERGON_RAY_SHARD_CACHE_DIR`` (default: ``<tmp>/energon_ray_shard_cache-<uid>``; a private
        folder of this user's: see :func:`private_folder`).

        Raises:
            ValueError: a budget that is not a number >= 0, naming the variable.
        """
        raw = os.environ.get(BYTES_ENV, "").strip()
        if not raw:
            return None
        try:
            budget = int(float(raw))
        except ValueError:
            raise ValueError(f"{BYTES_ENV}={raw!r} is not a number of bytes") from None
        if budget < 0:
            raise ValueError(f"{BYTES_ENV}={raw!r} must be >= 0")
        if budget == 0:
            return None
        folder = os.environ.get(DIR_ENV) or user_temp_folder("energon_ray_shard_cache")
        return cls(directory=folder, max_bytes=budget)


def user_temp_folder(name: str) -> str:
    """``<tmp>/<name>-<uid>``: a default cache folder of this user's own (a shared name in the temp folder
    could be made first, or filled, by another user of the node)."""
    return os.path.join(tempfile.gettempdir(), f"{name}-{os.getuid() if hasattr(os, 'getuid') else 'user'}")


def folder_problem(path: str, follow_links: bool = False) -> Optional[str]:
    """Why files read back from folder ``path`` may not be ours: ``"link"`` (not a folder itself, or not
    one at all), ``"owner"`` (another user's) or ``"writable"`` (by others); ``None`` when it is a
    folder of this user that others cannot write (``follow_links``: judge where a link leads)."""
    st = os.stat(path) if follow_links else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "link"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return "owner"
    return "writable" if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) else None


def private_folder(path: str) -> str:
    """``path``, created with mode 0700 or checked to be a folder of this user that others cannot write:
    files read back from it (shards, index.sqlite copies, dataset code) must be the ones we wrote.

    Raises:
        StorageError: naming the folder, when it is a link, another user's, or writable by others.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    if folder_problem(path) is not None:
        raise StorageError(
            path, "cache folder is not a private folder of this user (a link, another owner, or writable by others), "
            "so another user could put files there; remove it, chmod 700 it, or choose another folder"
        )
    return path


class ShardCache:
    """Whole shards on local disk, least recently used evicted first.

    Example:
        >>> import tempfile
        >>> cache = ShardCache(CacheConfig(tempfile.mkdtemp(), max_bytes=10))
        >>> path = cache.local_copy("s3://b/a.tar", 4, "etag", lambda f: f.write(b"abcd"))
        >>> open(path, "rb").read()
        b'abcd'
        >>> cache.local_copy("s3://b/big.tar", 11, "etag", lambda f: f.write(b"x" * 11)) is None
        True
    """

    def __init__(self, config: CacheConfig):
        self.config = config

    def _name(self, url: str, size: int, etag: str) -> str:
        digest = hashlib.sha256(f"{url}\0{size}\0{etag}".encode()).hexdigest()[:40]
        return os.path.join(self.config.directory, f"{digest}.{size}.shard")

    def local_copy(self, url: str, size: int, etag: str, download: Callable) -> Optional[str]:
        """The local file holding the shard, downloading it with ``download(file)`` when missing.

        Returns None when the shard alone is larger than the budget.
        """
        if size > self.config.max_bytes:
            return None
        private_folder(self.config.directory)
        path = self._name(url, size, etag)
        if os.path.exists(path):
            try:
                os.utime(path)  # most recently used
                return path
            except FileNotFoundError:  # evicted by another process just now
                pass
        self._make_room(size)
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            with open(tmp, "wb") as file:
                download(file)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def _make_room(self, size: int) -> None:
        """Evict least recently used shards until ``size`` more bytes fit in the budget."""
        entries = []
        for entry in os.scandir(self.config.directory):
            if entry.name.endswith(".shard"):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(e[1] for e in entries)
        for _, nbytes, path in sorted(entries):
            if total + size <= self.config.max_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= nbytes


#: where ``local_file_copy`` keeps its copies (default ``<tmp>/energon_ray_file_cache-<uid>``)
FILE_DIR_ENV = "ENERGON_RAY_FILE_CACHE_DIR"
#: the byte budget of those copies (least recently used evicted first)
FILE_CACHE_BYTES = 16 << 30


def local_file_copy(path) -> str:
    """A local file with the bytes of the remote object ``path`` (a ``RemotePath``), for readers that
    need a real file (sqlite on a dataset's ``index.sqlite``).

    The copy is shared by every process of the node and named by the object's URL, size and ETag, so a
    changed object is fetched again; downloads go to a temporary name and are renamed. An object
    larger than the budget is copied into a private temporary file instead.

    Raises:
        ObjectNotFoundError: no such object.
    """
    stat = path.stat()
    size, etag = stat.st_size, stat.etag

    def download(file) -> None:
        file.write(path.read_bytes())

    folder = os.environ.get(FILE_DIR_ENV) or user_temp_folder("energon_ray_file_cache")
    local = ShardCache(CacheConfig(directory=folder, max_bytes=FILE_CACHE_BYTES)).local_copy(str(path), size, etag, download)
    if local is None:
        handle, local = tempfile.mkstemp(suffix=f".{path.name}")
        with os.fdopen(handle, "wb") as file:
            download(file)
    return local
