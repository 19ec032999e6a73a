"""``DiskCache``: a folder of cached files that every process of a node shares, under a byte and
file-count budget, evicting the least recently used entries.

Sharing without a server: an entry is written to a temporary file and renamed into place (readers
see whole files or none); admissions and evictions hold an ``fcntl`` lock on a lock file beside the
folder; a hit refreshes the file's mtime, which orders eviction. A reader that opened a file keeps
reading it even if another process evicts it meanwhile (POSIX unlink semantics).

Beside it, per-process folders (``process_dir``: a pool's prefetch buffer, swept when their process
is gone) hold copies of entries, hard links where they can be (``link_or_write``, ``read_entry_file``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from energon_ray.storage.cache import folder_problem

if TYPE_CHECKING:
    from energon_ray.samples.base import SourceInfo

_MAGIC = b"ERC1"
#: entries (evictable) end with this; ``to_cache`` objects do not
ENTRY_SUFFIX = ".entry"


def _private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check that an existing one is ours and not open to others."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = folder_problem(str(path), follow_links=True)
    if problem == "owner":
        raise PermissionError(f"{path}: cache folder belongs to another user (uid {path.stat().st_uid}); choose another parent_cache_dir")
    if problem == "writable":
        raise PermissionError(f"{path}: cache folder is writable by other users; chmod 700 it or choose another parent_cache_dir")
    return path


class DiskCache:
    """Files keyed by strings, shared by the processes that open the same folder.

    Args:
        parent: where the cache folder (``energon_ray_cache``) and its lock/scratch live.
        max_bytes: budget of the entries' payload bytes; the oldest entries are evicted beyond it.
        max_count: budget of the number of entries.
    """

    def __init__(self, parent: Path, max_bytes: int, max_count: int):
        self.parent = Path(parent)
        self.max_bytes = int(max_bytes)
        self.max_count = int(max_count)
        self.dir = _private_dir(self.parent / "energon_ray_cache").resolve()
        self.scratch = _private_dir(self.parent / "energon_ray_cache.tmp")
        self.lock_file = self.parent / "energon_ray_cache.lock"

    @staticmethod
    def entry_name(key: str) -> str:
        return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + ENTRY_SUFFIX

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The node-wide lock over admissions and evictions."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- entries -------------------------------------------------------------------------------
    def path_of(self, key: str) -> Path:
        """Where ``key``'s entry file is (or would be)."""
        return self.dir / self.entry_name(key)

    @staticmethod
    def pack(key: str, header: Dict[str, Any], payload: bytes) -> bytes:
        """An entry file's bytes: magic, header length, JSON header (with ``key``), payload."""
        head = json.dumps({**header, "key": key}).encode("utf-8")
        return _MAGIC + len(head).to_bytes(4, "big") + head + payload

    @staticmethod
    def unpack(blob: bytes, key: str) -> Optional[Tuple[Dict[str, Any], bytes]]:
        """``(header, payload)`` of an entry file's bytes; ``None`` if malformed or another key's."""
        if len(blob) < 8 or blob[:4] != _MAGIC:
            return None
        size = int.from_bytes(blob[4:8], "big")
        header = json.loads(blob[8 : 8 + size].decode("utf-8"))
        if header.get("key") != key:  # a hash collision: treat as a miss
            return None
        return header, blob[8 + size :]

    def read(self, key: str) -> Optional[Tuple[Dict[str, Any], bytes]]:
        """``(header, payload)`` of ``key``, or ``None`` if it is not (or no longer) cached."""
        path = self.path_of(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        try:
            os.utime(path)  # LRU: a hit is a use
        except OSError:
            pass
        return self.unpack(blob, key)

    def write(self, key: str, header: Dict[str, Any], payload: bytes) -> bool:
        """Admit ``key`` (evicting older entries as the budget needs); ``False`` if it can never fit."""
        if len(payload) > self.max_bytes or self.max_count < 1:
            return False
        tmp = self.scratch / f"{os.getpid()}-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(self.pack(key, header, payload))
        try:
            with self.locked():
                os.replace(tmp, self.path_of(key))
                self._evict(keep=self.entry_name(key))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return True

    def _entries(self) -> List[Tuple[float, int, str]]:
        out = []
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.endswith(ENTRY_SUFFIX):
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    out.append((st.st_mtime_ns, st.st_size, e.name))
        return out

    def _evict(self, keep: str) -> None:
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        count = len(entries)
        # budgets count file sizes (payload + a small header); the newest entry stays
        for _, size, name in entries:
            if total <= self.max_bytes and count <= self.max_count:
                break
            if name == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / name)
            total -= size
            count -= 1

    def usage(self) -> Tuple[int, int]:
        """``(bytes, entries)`` cached now (all processes)."""
        entries = self._entries()
        return sum(size for _, size, _ in entries), len(entries)

    def evict_key(self, key: str) -> None:
        """Drop ``key`` if cached."""
        with self.locked(), contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_of(key))


def process_dir(parent: Path, name: str) -> Path:
    """A private folder of this process under ``parent/name``, after removing those of dead processes
    of this host (``<host>.<pid>.<uuid>``)."""
    root = _private_dir(Path(parent) / name)
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for old in root.iterdir():
            owner, _, rest = old.name.rpartition(".")  # "<host>.<pid>" + "." + "<uuid>"
            old_host, _, pid = owner.rpartition(".")
            if old_host == host and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
    path = root / f"{host}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    return path.resolve()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def link_or_write(path: Path, node_file: Optional[Path], blob: bytes) -> None:
    """Put an entry at ``path``: a hard link of its node-cache file if it still exists, else ``blob``
    written (renamed into place)."""
    if node_file is not None:
        try:
            os.link(node_file, path)
            return
        except OSError:  # evicted meanwhile, or no hard links here
            pass
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(blob)
    os.replace(tmp, path)


def read_entry_file(path: Optional[Path], key: str) -> Tuple[Dict[str, Any], bytes]:
    """``(header, payload)`` of an entry file outside the cache folder (a process's buffered copy)."""
    if path is None:
        raise RuntimeError(f"buffered entry {key!r} has no file")
    entry = DiskCache.unpack(path.read_bytes(), key)
    if entry is None:
        raise RuntimeError(f"{path}: not an entry of {key!r} (the buffer folder was changed)")
    return entry


def entry_header(info: Optional[SourceInfo], fname: str) -> Dict[str, Any]:
    """The JSON header of a node-cache entry: where the file came from and its name."""
    return {"source": info_to_json(info), "fname": fname}


def info_to_json(info: Optional[SourceInfo]) -> Optional[Dict[str, Any]]:
    """A ``SourceInfo`` as JSON values (``info_from_json`` reads it back)."""
    if info is None:
        return None
    return {
        "dataset_path": None if info.dataset_path is None else str(info.dataset_path),
        "index": info.index, "shard_name": None if info.shard_name is None else str(info.shard_name),
        "file_names": list(info.file_names),
    }  # fmt: skip


def info_from_json(data: Optional[Dict[str, Any]]) -> Optional[SourceInfo]:
    """The ``SourceInfo`` ``info_to_json`` wrote."""
    if data is None:
        return None
    from energon_ray.samples.base import SourceInfo

    return SourceInfo(data["dataset_path"], data["index"], data["shard_name"], tuple(data["file_names"]))
