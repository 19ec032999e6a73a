"""``RemotePath``: the part of ``pathlib.Path`` the dataset format needs, for object store URLs.

``as_path`` returns a plain ``pathlib.Path`` for local paths (so local datasets keep their file
reads, mmaps and ``pread`` calls) and a :class:`RemotePath` for ``s3://`` and ``msc://`` URLs. A
remote path carries the settings of the process that made it; pickled into a Ray task it reaches the
same store from any node. Its repr and str are the URL, never a credential.
"""

from __future__ import annotations

import fnmatch
import io
import threading
import types
from pathlib import Path, PurePath, PurePosixPath
from typing import IO, Any, Dict, Iterator, Optional, Tuple, Union

from energon_ray.storage.errors import BucketNotFoundError, ObjectNotFoundError, StorageError
from energon_ray.storage.remote_file import RemoteFile

SCHEMES = ("s3", "msc")
_PREFIXES = tuple(f"{s}://" for s in SCHEMES)
#: multi-storage-client's reserved profile of the local file system (Energon's ``EPath`` reads
#: ``msc://__filesystem__/data/ds`` as the local ``/data/ds``)
POSIX_PROFILE = "__filesystem__"
_POSIX_URL = f"msc://{POSIX_PROFILE}"


def local_of(url: str) -> Optional[str]:
    """The local path an ``msc://__filesystem__/…`` URL stands for; None for any other string.

    Example:
        >>> local_of("msc://__filesystem__/data/ds"), local_of("msc://profile/data/ds")
        ('/data/ds', None)
    """
    if url == _POSIX_URL or url.startswith(_POSIX_URL + "/"):
        return "/" + url[len(_POSIX_URL) :].lstrip("/")
    return None


def is_remote(path: Any) -> bool:
    """Whether ``path`` is an object store URL (``s3://``, ``msc://``) or a :class:`RemotePath`
    (``msc://__filesystem__/…`` is a local path)."""
    if isinstance(path, RemotePath):
        return True
    return isinstance(path, str) and path.startswith(_PREFIXES) and local_of(path) is None


def as_path(path: Union[str, PurePath, "RemotePath"], settings: Any = None) -> Union[Path, "RemotePath"]:
    """``pathlib.Path`` for a local path (``msc://__filesystem__/p`` too), :class:`RemotePath` for a URL
    (with ``settings``, or the ones this process's environment gives).

    Example:
        >>> as_path("/data/ds") / "shards", as_path("msc://__filesystem__/data/ds")
        (PosixPath('/data/ds/shards'), PosixPath('/data/ds'))
    """
    if isinstance(path, RemotePath):
        return path if settings is None or settings == path.settings else RemotePath(str(path), settings)
    if isinstance(path, str) and local_of(path) is not None:
        return Path(local_of(path))
    if isinstance(path, str) and path.startswith(_PREFIXES):
        return RemotePath(path, settings)
    return Path(path)


def settings_of(path: Any) -> Any:
    """The settings a remote path carries (None for a local path)."""
    return path.settings if isinstance(path, RemotePath) else None


def _normalize(key: str, url: str) -> str:
    """``a//b/./c/../d`` → ``a/b/d``.

    Raises:
        ValueError: ``..`` that leads above the bucket or profile.
    """
    parts: list = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{url}: the path leads above the bucket or profile root")
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


_BACKENDS: Dict[Tuple[str, str, Any], Any] = {}
_LOCK = threading.Lock()


def _default_settings(scheme: str, netloc: str) -> Any:
    if scheme == "s3":
        from energon_ray.storage.s3 import S3Settings

        return S3Settings.from_environment()
    import importlib.util

    if importlib.util.find_spec("multistorageclient") is None:
        raise StorageError(f"msc://{netloc}", "msc:// paths need multi-storage-client (pip install 'energon-ray[msc]', or multi-storage-client)")
    from energon_ray.storage.msc import MscSettings

    return MscSettings.from_environment(netloc)


def _backend(scheme: str, netloc: str, settings: Any) -> Any:
    key = (scheme, netloc, settings)
    with _LOCK:
        backend = _BACKENDS.get(key)
    if backend is None:
        if scheme == "s3":
            from energon_ray.storage.s3 import S3Backend

            backend = S3Backend(netloc, settings)
        else:
            from energon_ray.storage.msc import MscBackend

            backend = MscBackend(netloc, settings)
        with _LOCK:
            backend = _BACKENDS.setdefault(key, backend)
    return backend


class RemotePath:
    """An object (or a prefix, when used as a folder) in a bucket or msc profile.

    Args:
        url: ``s3://bucket/key`` or ``msc://profile/path``.
        settings: how to reach the store (default: from this process's environment).

    Raises:
        ValueError: a URL without a bucket/profile, or one that leads above it with ``..``.

    Example:
        >>> p = RemotePath("s3://bucket/data/ds", settings=object())
        >>> str(p / "../other/./ds"), p.name, str(p.parent), (p / "a.tar").suffix
        ('s3://bucket/data/other/ds', 'ds', 's3://bucket/data', '.tar')
    """

    __slots__ = ("scheme", "netloc", "key", "settings")

    def __init__(self, url: str, settings: Any = None):
        scheme, sep, rest = str(url).partition("://")
        netloc, _, key = rest.partition("/")
        if not sep or scheme not in SCHEMES or not netloc:
            raise ValueError(f"{url!r} is not a storage URL (s3://bucket/key or msc://profile/path)")
        if local_of(str(url)) is not None:
            raise ValueError(f"{url!r} is the local path {local_of(str(url))} (as_path gives it)")
        self.scheme = scheme
        self.netloc = netloc
        self.key = _normalize(key, url)
        self.settings = settings if settings is not None else _default_settings(scheme, netloc)

    # -- pickling, identity ---------------------------------------------------------------------
    def __reduce__(self):
        return (RemotePath, (str(self), self.settings))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}/{self.key}" if self.key else f"{self.scheme}://{self.netloc}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    # -- pure path operations ---------------------------------------------------------------------
    def _with_key(self, key: str) -> "RemotePath":
        out = object.__new__(RemotePath)
        out.scheme, out.netloc, out.settings = self.scheme, self.netloc, self.settings
        out.key = _normalize(key, f"{self.scheme}://{self.netloc}/{key}")
        return out

    def __truediv__(self, other: Union[str, PurePath]) -> Union["RemotePath", Path]:
        part = str(other)
        if part.startswith("/"):  # an absolute local path replaces this one, as in pathlib and Energon's EPath
            return Path(part)
        if part.startswith(_PREFIXES):  # a URL replaces this path (msc://__filesystem__/p: the local p)
            same = part.startswith(f"{self.scheme}://{self.netloc}/" if self.scheme == "msc" else "s3://")
            return as_path(part, self.settings if same else None)
        return self._with_key(f"{self.key}/{part}" if self.key else part)

    def joinpath(self, *parts: Union[str, PurePath]) -> "RemotePath":
        out = self
        for part in parts:
            out = out / part
        return out

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix if self.name else ""

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem if self.name else ""

    @property
    def parent(self) -> "RemotePath":
        return self._with_key(self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def with_name(self, name: str) -> "RemotePath":
        return self.parent / name

    def with_suffix(self, suffix: str) -> "RemotePath":
        return self.with_name(str(PurePosixPath(self.name).with_suffix(suffix)))

    def relative_to(self, other: Union[str, "RemotePath"]) -> PurePosixPath:
        base = other if isinstance(other, RemotePath) else RemotePath(str(other), self.settings)
        prefix = f"{base.key}/" if base.key else ""
        if (base.scheme, base.netloc, base.key) == (self.scheme, self.netloc, self.key):
            return PurePosixPath(".")  # as pathlib's
        if (base.scheme, base.netloc) != (self.scheme, self.netloc) or not self.key.startswith(prefix):
            raise ValueError(f"{self} is not under {base}")
        return PurePosixPath(self.key[len(prefix):])

    def is_relative_to(self, other: Union[str, "RemotePath"]) -> bool:
        try:
            self.relative_to(other)
        except ValueError:
            return False
        return True

    def is_absolute(self) -> bool:
        return True

    def resolve(self) -> "RemotePath":
        return self

    absolute = expanduser = resolve

    def as_posix(self) -> str:
        return str(self)

    # -- requests ----------------------------------------------------------------------------------
    @property
    def backend(self) -> Any:
        return _backend(self.scheme, self.netloc, self.settings)

    def head(self) -> Optional[Tuple[int, str]]:
        """``(size, etag)``, or None when no object has this key."""
        return self.backend.head(str(self), self.key) if self.key else None

    def is_file(self) -> bool:
        return self.head() is not None

    def is_dir(self) -> bool:
        prefix = f"{self.key}/" if self.key else ""
        return any(True for _ in self.backend.list(str(self), prefix, limit=1))

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> Any:
        """An ``os.stat_result``-like object with ``st_size``.

        Raises:
            ObjectNotFoundError: no such object.
        """
        found = self.head()
        if found is None:
            raise ObjectNotFoundError(str(self), "no such object")
        return types.SimpleNamespace(st_size=found[0], etag=found[1])

    def read_bytes(self) -> bytes:
        return self.backend.get(str(self), self.key)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def read_range(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` with one ranged request (retried on transient errors).

        Raises:
            TruncatedObjectError: the object ends before ``offset + length``.
        """
        return self.backend.get(str(self), self.key, offset, offset + length)

    def write_bytes(self, data: bytes) -> int:
        self.backend.put(str(self), self.key, bytes(data))
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise ObjectNotFoundError(str(self), "no such object")
        self.backend.delete(str(self), self.key)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: object stores have no folders."""

    def walk_files(self) -> Iterator[Tuple["RemotePath", int]]:
        """Every object under this prefix as ``(path, size)``, in key order; folder markers (empty
        ``folder/`` objects that consoles and FUSE mounts make) are no files, and are left out."""
        prefix = f"{self.key}/" if self.key else ""
        for key, size in self.backend.list(str(self), prefix):
            if not key.endswith("/"):
                yield self._with_key(key), size

    def glob(self, pattern: str) -> Iterator["RemotePath"]:
        """Objects under this prefix matching ``pattern``: ``*.tar`` (this level) or ``**/*.tar`` (any depth)."""
        deep = pattern.startswith("**/")
        leaf = pattern[3:] if deep else pattern
        if "/" in leaf or "**" in leaf:
            raise ValueError(f"{self}: glob pattern {pattern!r} is not supported on remote paths (use '**/*.ext')")
        for path, _ in self.walk_files():
            relative = str(path.relative_to(self))
            if (deep or "/" not in relative) and fnmatch.fnmatchcase(path.name, leaf):
                yield path

    rglob = glob

    def open(self, mode: str = "r", buffering: int = 64 * 1024, encoding: Optional[str] = None) -> IO[Any]:
        """A seekable read-only file over the object: reads are ranged requests with a growing read-ahead.
        ``"r"`` (the default, as ``pathlib.Path.open`` and Energon's ``EPath.open``) gives text, ``"rb"`` bytes.

        Raises:
            ValueError: a mode that writes (``"w"``, ``"a"``, ``"+"``…).
            ObjectNotFoundError: no such object.
        """
        if mode not in ("r", "rt", "rb"):
            raise ValueError(f"{self}: remote files open read-only ('r' or 'rb'), not {mode!r}")
        binary = io.BufferedReader(RemoteFile(self), buffer_size=buffering)
        return binary if mode == "rb" else io.TextIOWrapper(binary, encoding=encoding or "utf-8")


def read_optional(path: Any) -> Optional[bytes]:
    """The bytes of a file or object, or None when it does not exist (one request when remote).

    Raises:
        BucketNotFoundError: the bucket does not exist (a wrong URL, not a missing file).
    """
    p = as_path(path)
    if isinstance(p, RemotePath):
        try:
            return p.read_bytes()
        except BucketNotFoundError:
            raise
        except ObjectNotFoundError:
            return None
    return p.read_bytes() if p.is_file() else None


__all__ = ["RemotePath", "RemoteFile", "StorageError", "as_path", "is_remote", "local_of", "read_optional", "settings_of"]
