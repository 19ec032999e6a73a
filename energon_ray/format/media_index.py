"""Media metadata at prepare time: which tar members are media, what they hold, and the
``media_metadata`` / ``media_filters`` tables of ``.nv-meta/index.sqlite`` (Energon's layout).

``media_metadata(entry_key, metadata_type, metadata_json)`` has one row per media member, keyed by
its full entry name ``"<sample key>.<part>"``; ``media_filters(strategy, patterns)`` records how the
media were chosen. Energon's ``WebdatasetFileStore.get_media_metadata`` reads the table we write,
and :meth:`energon_ray.cache.stores.DatasetFileStore.get_media_metadata` reads Energon's.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import io
import logging
import os
import shutil
import sqlite3
import tarfile
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import filetype
from tqdm import tqdm

from energon_ray.decode.media_metadata import (
    ImageMetadata,
    MediaMetadataBase,
    MediaMetadataType,
    serialize_media_metadata,
)
from energon_ray.errors import DatasetConfigError
from energon_ray.format.indexer import INDEX_SQLITE, find_shards, scratch_folder
from energon_ray.format.info import check_write_target, meta_dir, read_info
from energon_ray.format.pool import process_pool
from energon_ray.format.tar_reader import SKIP_META_RE, TAR_ENCODING, split_member_name
from energon_ray.storage import RemotePath, as_path

logger = logging.getLogger(__name__)

STRATEGIES = ("EXTENSION", "HEADER", "GLOB")

IMAGE_EXTENSIONS = frozenset("bmp gif ico j2k jp2 jpx jpeg jpg png tif tiff webp".split())
AV_EXTENSIONS = frozenset("aac avi flac m4a m4v mkv mov mp3 mp4 ogg wav webm".split())

_ROWS_PER_INSERT = 1000


@dataclasses.dataclass(frozen=True)
class MediaFilter:
    """How ``prepare`` picks the tar members whose metadata it stores.

    Attributes:
        strategy: ``"EXTENSION"`` (the part's extension is a known image/audio/video one),
            ``"HEADER"`` (the bytes' file signature, else the extension) or ``"GLOB"`` (entry names
            matching one of ``patterns``; the kind is then found as with ``"HEADER"``).
        patterns: glob patterns for ``"GLOB"``, e.g. ``("*.jpg", "*.png")``.

    Example:
        >>> MediaFilter.parse(glob="*.jpg,*.png")
        MediaFilter(strategy='GLOB', patterns=('*.jpg', '*.png'))
        >>> MediaFilter.parse(extension=True).media_type("s0.JPG", b"")
        <MediaMetadataType.IMAGE: 'image'>
    """

    strategy: str
    patterns: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"MediaFilter: strategy must be one of {list(STRATEGIES)}, got {self.strategy!r}")
        if (self.strategy == "GLOB") != bool(self.patterns):
            raise ValueError(f"MediaFilter: patterns go with strategy GLOB only, got {self!r}")

    @classmethod
    def parse(cls, glob: Optional[str] = None, header: bool = False, extension: bool = False) -> "MediaFilter":
        """The filter of ``--media-metadata-by-glob/-header/-extension`` (exactly one must be given).

        Raises:
            ValueError: none or several of the three, or an empty pattern.
        """
        if sum((bool(glob), bool(header), bool(extension))) != 1:
            raise ValueError(
                "give exactly one of --media-metadata-by-glob PATTERNS, --media-metadata-by-header and "
                "--media-metadata-by-extension (several globs go in one, separated by commas)"
            )
        if glob:
            patterns = tuple(glob.split(","))
            if not all(patterns):
                raise ValueError(f"--media-metadata-by-glob: empty pattern in {glob!r}")
            return cls("GLOB", patterns)
        return cls("HEADER" if header else "EXTENSION")

    @classmethod
    def coerce(cls, value: object) -> "MediaFilter":
        """``value`` as a :class:`MediaFilter`; also takes Energon's ``MediaFilterConfig`` (same fields).

        Raises:
            TypeError: for an object without a ``strategy``.
        """
        if isinstance(value, cls):
            return value
        strategy = getattr(value, "strategy", None)
        if strategy is None:
            raise TypeError(f"media_filter: expected a MediaFilter (MediaFilter.parse(...)), got {value!r}")
        return cls(str(getattr(strategy, "value", strategy)), tuple(getattr(value, "patterns", None) or ()))

    def may_be_media(self, name: str) -> bool:
        """Whether the member ``name`` can be media before its bytes are read (they are needed for HEADER)."""
        if self.strategy == "HEADER":
            return True
        if self.strategy == "EXTENSION":
            return _type_by_extension(name) is not None
        return any(fnmatch.fnmatchcase(name.lower(), p) or fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def media_type(self, name: str, data: bytes) -> Optional[MediaMetadataType]:
        """The kind of media ``data`` (member ``name``) is under this filter, or ``None`` if it is none."""
        if not self.may_be_media(name):
            return None
        if self.strategy == "EXTENSION":
            return _type_by_extension(name)
        return _type_by_header(data) or _type_by_extension(name)


def _type_by_extension(name: str) -> Optional[MediaMetadataType]:
    ext = PurePosixPath(name).suffix.lstrip(".").lower()
    if ext in IMAGE_EXTENSIONS:
        return MediaMetadataType.IMAGE
    if ext in AV_EXTENSIONS:
        return MediaMetadataType.AV
    return None


def _type_by_header(data: bytes) -> Optional[MediaMetadataType]:
    kind = filetype.guess(data)
    mime = getattr(kind, "mime", None) or ""
    if mime.startswith("image/"):
        return MediaMetadataType.IMAGE
    if mime.startswith(("video/", "audio/")):
        return MediaMetadataType.AV
    return None


def read_media_metadata(
    kind: MediaMetadataType, name: str, data: bytes, skipped: Optional[List[str]] = None
) -> Optional[MediaMetadataBase]:
    """Image size/format/mode (PIL) or audio/video stream facts (PyAV) of ``data``; ``None`` if unreadable.

    Unreadable media are left out, as Energon leaves them out: logged at debug level, and named in
    ``skipped`` (``"name: reason"``) when given, so a caller can count and report them.
    """
    try:
        if kind is MediaMetadataType.IMAGE:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as image:
                image.load()
                return ImageMetadata(
                    width=image.width, height=image.height, format=image.format or "UNKNOWN", mode=image.mode or "UNKNOWN"
                )
        from energon_ray.decode.av import AVDecoder  # PyAV and torch load only when a dataset has AV media

        return AVDecoder(data, key=name).get_metadata(get_audio_num_samples=True)
    except Exception as exc:
        logger.debug("%s: cannot read %s metadata; no row stored", name, kind.value, exc_info=True)
        if skipped is not None:
            skipped.append(f"{name}: {type(exc).__name__}: {exc}")
        return None


def shard_media_rows(
    root: Path | str | RemotePath, shard: str, media_filter: MediaFilter, skipped: Optional[List[str]] = None
) -> Iterator[Tuple[str, str, str]]:
    """``(entry_key, metadata_type, metadata_json)`` for each media member of one shard, in tar order
    (unreadable media named in ``skipped``, see ``read_media_metadata``).

    Raises:
        DatasetConfigError: the shard cannot be read as a tar file.
    """
    path = as_path(root) / shard
    try:
        with path.open("rb") as file, tarfile.open(fileobj=file, mode="r:*", **TAR_ENCODING) as tar:
            for member in tar:
                split = split_member_name(member.name)
                if not member.isreg() or SKIP_META_RE.match(member.name) or split is None:
                    continue
                entry_key = f"{split[0]}.{split[1]}"
                if not media_filter.may_be_media(entry_key):
                    continue
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                kind = media_filter.media_type(entry_key, data)
                missed: List[str] = []
                metadata = read_media_metadata(kind, entry_key, data, missed) if kind is not None else None
                if skipped is not None:
                    skipped.extend(f"{shard}: {entry}" for entry in missed)
                if metadata is not None:
                    stored_type, text = serialize_media_metadata(metadata)
                    yield entry_key, stored_type.value, text
    except tarfile.TarError as exc:
        raise DatasetConfigError(f"{path}: not a readable tar file: {exc}") from None


def _fill_tables(db: sqlite3.Connection, rows: Iterator[Tuple[str, str, str]], media_filter: MediaFilter) -> int:
    db.execute("DROP TABLE IF EXISTS media_metadata")
    db.execute("DROP TABLE IF EXISTS media_filters")
    db.execute(
        "CREATE TABLE media_metadata (entry_key TEXT PRIMARY KEY, metadata_type TEXT NOT NULL, "
        "metadata_json TEXT NOT NULL)"
    )
    db.execute(
        "CREATE TABLE media_filters (filter_id INTEGER PRIMARY KEY AUTOINCREMENT, strategy TEXT NOT NULL, "
        "patterns TEXT, created_at_utc TEXT DEFAULT CURRENT_TIMESTAMP, UNIQUE(strategy, patterns))"
    )
    count, batch = 0, []
    for row in rows:
        batch.append(row)
        if len(batch) >= _ROWS_PER_INSERT:
            db.executemany("INSERT OR REPLACE INTO media_metadata VALUES (?, ?, ?)", batch)
            count, batch = count + len(batch), []
    db.executemany("INSERT OR REPLACE INTO media_metadata VALUES (?, ?, ?)", batch)
    db.execute(
        "INSERT OR IGNORE INTO media_filters (strategy, patterns) VALUES (?, ?)",
        (media_filter.strategy, ",".join(media_filter.patterns)),
    )
    return count + len(batch)


def write_media_metadata(
    path: Path | str, media_filter: MediaFilter, *, shards: Optional[Sequence[str]] = None, progress: bool = False,
    skipped: Optional[List[str]] = None, scratch_dir: Optional[Path | str] = None, num_workers: int = 1,
) -> int:
    """Store the metadata of every media member of a prepared dataset in its ``index.sqlite``.

    Replaces the ``media_metadata`` and ``media_filters`` tables (Energon's ``energon prepare
    --media-metadata-by-…`` and ``energon prepare-media``); the sample tables stay as they are.

    Args:
        path: the dataset folder or URL (already indexed: ``.nv-meta/index.sqlite`` exists).
        media_filter: which members are media (:meth:`MediaFilter.parse`).
        shards: shard names to scan; default: those of ``.nv-meta/.info.json``.
        progress: show a progress bar over shards.
        skipped: a list to which each unreadable media member is added (``"shard: entry: reason"``).
        scratch_dir: where a remote dataset's ``index.sqlite`` is updated before it is uploaded
            (``indexer.scratch_folder``).
        num_workers: processes reading shards in parallel (the rows stored are the same, in the same order).

    Returns:
        The number of rows stored.

    Raises:
        DatasetConfigError: not prepared, no ``index.sqlite``, or an unreadable shard.
    """
    root = as_path(path)
    names: List[str] = list(shards) if shards is not None else list(read_info(root))
    final = check_write_target(root, meta_dir(root) / INDEX_SQLITE)
    if not final.exists():
        raise DatasetConfigError(f"{root}: no .nv-meta/{INDEX_SQLITE}; run `energon-ray prepare {root}` first")
    rows = _pooled_rows(functools.partial(_shard_job, root, media_filter), names, num_workers, skipped, progress, "shard")
    return _store(root, final, rows, media_filter, scratch_dir)


Row = Tuple[str, str, str]


def _shard_job(root: Path | RemotePath, media_filter: MediaFilter, name: str) -> Tuple[List[Row], List[str]]:
    skipped: List[str] = []
    return list(shard_media_rows(root, name, media_filter, skipped)), skipped


def _file_job(root: Path, media_filter: MediaFilter, relative: str) -> Tuple[List[Row], List[str]]:
    skipped: List[str] = []
    row = _file_row(root, relative, media_filter, skipped)
    return ([row] if row is not None else []), skipped


def _pooled_rows(
    job: Callable[[str], Tuple[List[Row], List[str]]], items: List[str], num_workers: int,
    skipped: Optional[List[str]], progress: bool, unit: str,
) -> Iterator[Row]:  # fmt: skip
    """The rows of ``job`` over ``items`` in ``items`` order: from a pool of processes where
    ``num_workers`` > 1 (and there is more than one item), else in this process."""
    workers = min(num_workers, len(items))
    pool = process_pool(workers) if workers > 1 else None  # before the bar (its monitor is a thread)
    results = pool.map(job, items, chunksize=max(1, len(items) // (8 * workers))) if pool else map(job, items)
    try:
        for rows, missed in tqdm(results, total=len(items), desc="Media metadata", unit=unit, disable=not progress):
            if skipped is not None:
                skipped.extend(missed)
            yield from rows
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _media_files(root: Path, media_filter: MediaFilter) -> List[str]:
    """Relative paths of the files under ``root`` that may be media (sorted; ``.nv-meta`` left out)."""
    files = (p.relative_to(root) for p in sorted(root.rglob("*")) if p.is_file())
    return [f.as_posix() for f in files if f.parts[0] != ".nv-meta" and media_filter.may_be_media(f.name)]


def _file_row(root: Path, relative: str, media_filter: MediaFilter, skipped: Optional[List[str]]) -> Optional[Row]:
    """``(relative path, metadata_type, metadata_json)`` of a media file under a plain folder (the
    ``entry_key`` Energon's ``SystemFileStore`` looks up); ``None`` where it is no readable media."""
    data = (root / relative).read_bytes()
    name = PurePosixPath(relative).name
    kind = media_filter.media_type(name, data)
    metadata = read_media_metadata(kind, relative, data, skipped) if kind is not None else None
    if metadata is None:
        return None
    stored_type, text = serialize_media_metadata(metadata)
    return relative, stored_type.value, text


def write_folder_media_metadata(
    path: Path | str, media_filter: MediaFilter, skipped: Optional[List[str]] = None, num_workers: int = 1
) -> int:
    """Store the metadata of the media files of a plain local folder in its ``.nv-meta/index.sqlite``
    (Energon's ``energon prepare-media`` on a filesystem dataset; read by ``SystemFileStore``);
    ``num_workers``: processes reading files in parallel (the same rows, in the same order).

    Returns:
        The number of rows stored.

    Raises:
        DatasetConfigError: the folder does not exist or is remote, or holds tar shards (a dataset
            not prepared yet: its tars are no media files, nothing would be stored).
    """
    root = as_path(path)
    if isinstance(root, RemotePath) or not root.is_dir():
        raise DatasetConfigError(f"{root}: not a local folder; media metadata of plain folders is stored locally only")
    shards = find_shards(root)
    if shards:
        raise DatasetConfigError(
            f"{root}: not a prepared dataset (it holds tar shards, e.g. {shards[0]}, but no .nv-meta/.info.json); "
            f"run `energon-ray prepare {root}` first"
        )
    final = check_write_target(root, meta_dir(root) / INDEX_SQLITE)
    final.parent.mkdir(exist_ok=True)
    job = functools.partial(_file_job, root, media_filter)
    rows = _pooled_rows(job, _media_files(root, media_filter), num_workers, skipped, False, "file")
    return _store(root, final, rows, media_filter)


def _store(root, final, rows: Iterator[Tuple[str, str, str]], media_filter: MediaFilter, scratch_dir=None) -> int:
    """Fill the media tables of a copy of ``final`` (empty if it does not exist), then swap it in:
    readers never see a half-written index."""
    remote = isinstance(final, RemotePath)
    scratch = scratch_folder("energon_ray_media_", scratch_dir) if remote else None
    local = Path(scratch) / INDEX_SQLITE if scratch else check_write_target(root, final.parent / (INDEX_SQLITE + ".media.tmp"))
    try:
        local.write_bytes(final.read_bytes() if final.exists() else b"")
        db = sqlite3.connect(local)
        try:
            with db:
                count = _fill_tables(db, rows, media_filter)
        finally:
            db.close()
        if remote:
            final.write_bytes(local.read_bytes())
        else:
            os.replace(local, final)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        elif local.exists():
            local.unlink()
    return count
