"""The concrete file stores: a folder (``SystemFileStore``), a prepared dataset by ``key.part``
(``DatasetFileStore``, via its ``.nv-meta/index.sqlite``) and ``DecodeFileStore`` (decodes on read).

Stores pickle as their path; files and the index open again, lazily, in whatever process reads.
Both kinds also live on object stores (``s3://``, ``msc://``): files are then read with one request
each (a ranged one for a dataset member), and ``index.sqlite`` is copied once per node.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from energon_ray.cache.base import FileStore, FileStoreWrapper, PathStore
from energon_ray.decode.media_metadata import MediaMetadataBase, deserialize_media_metadata
from energon_ray.errors import SYSTEM_EXCEPTIONS, DatasetConfigError, MediaTooLargeError, SampleException, UntrustedCodeError
from energon_ray.format.indexer import open_index_readonly
from energon_ray.samples.base import SourceInfo
from energon_ray.storage import BucketNotFoundError, ObjectNotFoundError, RemotePath, TruncatedObjectError, as_path, is_remote
from energon_ray.storage.cache import local_file_copy

PathLike = Union[str, os.PathLike, RemotePath]


def _open_index(file: Union[Path, RemotePath]) -> sqlite3.Connection:
    """A read-only connection to an ``index.sqlite``, local or remote (then from the node's copy)."""
    local = Path(local_file_copy(file)) if isinstance(file, RemotePath) else file
    return open_index_readonly(local, any_thread=True)


def _media_metadata(db: sqlite3.Connection, where: Path, key: str) -> MediaMetadataBase:
    """The ``media_metadata`` row of ``key`` in an open ``index.sqlite`` (``where``: for messages)."""
    try:
        row = db.execute("SELECT metadata_type, metadata_json FROM media_metadata WHERE entry_key = ?", (key,)).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        raise DatasetConfigError(
            f"{where}: no media metadata in .nv-meta/index.sqlite; run `energon-ray prepare "
            f"--media-metadata-by-extension` (or -by-header/-by-glob) on it"
        ) from None
    if row is None:
        raise KeyError(f"{where}: no media metadata for {key!r}")
    return deserialize_media_metadata(row[0], row[1])


def _absolute(path: Union[Path, RemotePath]) -> Union[Path, RemotePath]:
    """A local path made absolute from this process's directory (as Energon's ``EPath``): the store goes
    to Ray workers, whose current directory is another; a URL as it is."""
    return path.absolute() if isinstance(path, Path) else path


class SystemFileStore(FileStore[bytes]):
    """Files of a folder, read as bytes (``filesystem://`` entries of a metadataset's ``aux``).

    Args:
        base_dir: the folder names are relative to (a local path or an ``s3://``/``msc://`` prefix);
            ``None``: names must be absolute paths or URLs.

    Raises (on read):
        KeyError: no such file, or a name that leads outside ``base_dir`` (``..``, absolute paths).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_bytes(b"hi")
        >>> SystemFileStore(d)["a.txt"][0]
        b'hi'
    """

    def __init__(self, base_dir: Optional[PathLike] = None):
        self.base_dir = None if base_dir is None else _absolute(as_path(base_dir))
        self._index_copy: Optional[Path] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"base_dir": self.base_dir}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["base_dir"])  # type: ignore[misc]

    def _resolve(self, key: str) -> Union[Path, RemotePath]:
        if self.base_dir is None:
            path = as_path(key)
            if not path.is_absolute():
                raise KeyError(f"SystemFileStore without base_dir needs absolute paths or URLs, got {key!r}")
            return path
        if isinstance(self.base_dir, RemotePath):
            if key.startswith("/") or is_remote(key):
                raise KeyError(f"{self.base_dir}: file name {key!r} leads outside the folder")
            try:
                path = self.base_dir / key
            except ValueError:  # '..' above the bucket
                raise KeyError(f"{self.base_dir}: file name {key!r} leads outside the folder") from None
            if path == self.base_dir or not path.is_relative_to(self.base_dir):
                raise KeyError(f"{self.base_dir}: file name {key!r} leads outside the folder")
            return path
        base = self.base_dir.resolve()
        path = (base / key).resolve()
        if path != base and base not in path.parents:
            raise KeyError(f"{self.base_dir}: file name {key!r} leads outside the folder")
        return path

    def __getitem__(self, key: str) -> Tuple[bytes, SourceInfo]:
        path = self._resolve(key)
        try:
            data = path.read_bytes()
        except BucketNotFoundError:
            raise
        except (FileNotFoundError, ObjectNotFoundError):
            raise KeyError(f"{self.get_path()}: no file {key!r} ({path})") from None
        except IsADirectoryError:
            raise KeyError(f"{self.get_path()}: {key!r} is a folder, not a file") from None
        return data, SourceInfo(dataset_path=self.get_path(), index=key, shard_name=self.get_path(), file_names=(key,))

    def get_path(self) -> str:
        return str(self.base_dir)

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        """The media metadata stored for file ``key`` (its path relative to ``base_dir``) in
        ``base_dir/.nv-meta/index.sqlite`` (``energon-ray prepare-media`` or ``energon prepare-media``).

        Raises:
            DatasetConfigError: no ``base_dir``, or no media metadata stored for the folder.
            KeyError: no metadata for ``key``.
        """
        if self.base_dir is None:
            raise DatasetConfigError("SystemFileStore without base_dir has no media metadata (it lives in base_dir/.nv-meta)")
        file = self._index_copy
        if file is None:
            file = self.base_dir / ".nv-meta" / "index.sqlite"
            if not file.is_file():
                raise DatasetConfigError(f"{self.base_dir}: no .nv-meta/index.sqlite; run `energon-ray prepare-media {self.base_dir}`")
            if isinstance(file, RemotePath):  # fetched once per node, looked up per process once
                file = self._index_copy = Path(local_file_copy(file))
        # A connection per call: the store stays a plain picklable object, and opening is cheap.
        with contextlib.closing(open_index_readonly(file)) as db:
            return _media_metadata(db, self.base_dir, key)

    def __repr__(self) -> str:
        return f"SystemFileStore(base_dir={self.get_path()!r})"


def _member_bytes(file: Union[Path, RemotePath], key: str, offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset + size)`` of a dataset's tar ``file``: the file ``key`` of a :class:`DatasetFileStore`.

    Raises:
        DatasetConfigError: the tar ends before them, naming it, ``key`` and the bytes (local or remote alike;
            remote had raised a ``TruncatedObjectError`` that named no file of the store).
    """
    if isinstance(file, RemotePath):
        try:
            return file.read_range(offset, size)
        except TruncatedObjectError as exc:
            raise _truncated_member(file, key, offset, size, exc.size) from None
    with open(file, "rb") as f:
        data = os.pread(f.fileno(), size, offset)
        if len(data) != size:
            raise _truncated_member(file, key, offset, size, os.fstat(f.fileno()).st_size)
    return data


def _truncated_member(file: Union[Path, RemotePath], key: str, offset: int, size: int, has: Optional[int]) -> DatasetConfigError:
    what = f"the file has {has} bytes" if has is not None else "the file is shorter"
    return DatasetConfigError(
        f"{file}: truncated: {key!r} wants bytes [{offset}, {offset + size}) but {what}; the shard changed after the dataset was prepared"
    )


class DatasetFileStore(PathStore):
    """The files of a prepared dataset by full entry name ``"<sample key>.<part>"`` (e.g. ``"000042.jpg"``).

    Looks the name up in ``.nv-meta/index.sqlite`` (written by ``energon-ray prepare`` and by
    ``energon prepare``) and reads only that member's bytes from its tar shard (on an object store:
    one ranged request; the index is copied once per node).

    Args:
        path: the dataset folder, local or an ``s3://``/``msc://`` URL.

    Raises:
        DatasetConfigError: not a prepared dataset, or no ``index.sqlite`` (on first read).
        KeyError: no sample/part of that name.
    """

    def __init__(self, path: PathLike):
        self.path = _absolute(as_path(path))
        self._local = threading.local()
        self._shards: Optional[List[str]] = None

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            from energon_ray.format.info import read_info

            file = self.path / ".nv-meta" / "index.sqlite"
            if not file.is_file():
                raise DatasetConfigError(
                    f"{self.path}: no .nv-meta/index.sqlite to look files up by name; run `energon-ray prepare {self.path}`"
                )
            self._shards = list(read_info(self.path))
            db = _open_index(file)
            self._local.db = db
        return db

    def _locate(self, key: str) -> Tuple[int, int, int, int, str]:
        db = self._db()
        # a sample key may itself hold dots: try each split point, shortest key first
        for i, ch in enumerate(key):
            if ch != ".":
                continue
            sample_key, part = key[:i], key[i + 1 :]
            hit = db.execute("SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (sample_key,)).fetchone()
            if hit is None:
                continue
            row = db.execute(
                "SELECT content_byte_offset, content_byte_size FROM sample_parts "
                "WHERE tar_file_id = ? AND sample_index = ? AND part_name = ?",
                (hit[0], hit[1], part),
            ).fetchone()
            if row is None:
                raise KeyError(f"{self.path}: sample {sample_key!r} has no part {part!r}")
            return int(hit[0]), int(hit[1]), int(row[0]), int(row[1]), sample_key
        raise KeyError(f"{self.path}: no file {key!r} (names are '<sample key>.<part>')")

    def __getitem__(self, key: str) -> Tuple[bytes, SourceInfo]:
        shard_id, _, offset, size, _ = self._locate(key)
        assert self._shards is not None
        if shard_id >= len(self._shards):
            raise DatasetConfigError(f"{self.path}: index.sqlite names shard #{shard_id}, .nv-meta lists {len(self._shards)}")
        shard = self._shards[shard_id]
        data = _member_bytes(self.path / shard, key, offset, size)
        # Energon's WebdatasetFileStore: the index is the file's name
        info = SourceInfo(dataset_path=self.get_path(), index=key, shard_name=shard, file_names=(key,))
        return data, info

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        """The media metadata ``prepare --media-metadata-by-…`` stored for file ``key`` (``"<sample key>.<part>"``).

        Raises:
            DatasetConfigError: the dataset was prepared without media metadata.
            KeyError: no metadata for ``key`` (no such file, or not a media file under the filter used).
        """
        return _media_metadata(self._db(), self.path, key)

    def __repr__(self) -> str:
        return f"DatasetFileStore({self.get_path()!r})"


class DecodeFileStore(FileStoreWrapper[Any]):
    """Decodes every file read from ``inner`` with ``decoder.decode(fname, data)`` (a ``SampleDecoder``
    or any ``FileStoreDecoder``): aux images come out as tensors, texts as ``str``, as in samples.

    Example:
        >>> from energon_ray import SampleDecoder
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_bytes(b"hi")
        >>> DecodeFileStore(SystemFileStore(d), decoder=SampleDecoder())["a.txt"][0]
        'hi'
    """

    def __init__(self, inner: FileStore[bytes], *, decoder: Any):
        super().__init__(inner)
        if not callable(getattr(decoder, "decode", None)):
            raise TypeError(f"DecodeFileStore: decoder needs a decode(fname, data) method, got {type(decoder).__name__}")
        self.decoder = decoder

    def __getitem__(self, fname: str) -> Tuple[Any, SourceInfo]:
        data, info = self._inner[fname]
        return self._decoded(fname, data), info

    def _decode_raw(self, data: Any, **kwargs: Any) -> Any:
        fname = kwargs["fname"]
        return self._decoded(fname, self._inner._decode_raw(data, **kwargs))

    def _decoded(self, fname: str, data: Any) -> Any:
        """``data`` decoded; a failure names the store and the file (the decoder's own message names
        only the part, e.g. ``jpg``). Refusals keep their type; other errors become SampleException."""
        try:
            return self.decoder.decode(fname, data)
        except (UntrustedCodeError, MediaTooLargeError) as exc:
            raise type(exc)(f"{self.get_path()}: file {fname!r}: {exc}") from None
        except SYSTEM_EXCEPTIONS:
            raise
        except Exception as exc:
            size = f" ({len(data)} bytes)" if isinstance(data, (bytes, bytearray, memoryview)) else ""
            raise SampleException(
                f"{self.get_path()}: cannot decode file {fname!r}{size}: {type(exc).__name__}: {exc}"
            ) from exc

    def _cache_identity(self) -> str:
        config = self.decoder.config() if callable(getattr(self.decoder, "config", None)) else type(self.decoder).__name__
        return f"Decode({self._inner._cache_identity()}, {config!r})"

    def __repr__(self) -> str:
        return f"DecodeFileStore(inner={self._inner!r}, decoder={self.decoder!r})"
