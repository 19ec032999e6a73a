"""Indexing tar shards: ``<shard>.tar.idx`` offsets, ``.nv-meta/index.sqlite`` and ``index.uuid``.

A sample is the run of consecutive tar members sharing a key; its offset is that of its first
header, and the index ends with the end offset of the last member (Energon's format).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sqlite3
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from tqdm import tqdm

from energon_ray.errors import DatasetConfigError
from energon_ray.format.info import check_write_target, meta_dir, write_file
from energon_ray.format.pool import process_pool
from energon_ray.format.tar_index import write_tar_index
from energon_ray.format.tar_reader import SKIP_META_RE, TAR_ENCODING, non_utf8_name, split_member_name
from energon_ray.storage import BucketNotFoundError, RemoteFile, RemotePath, as_path

INDEX_SQLITE = "index.sqlite"


def open_index_readonly(file: Path, *, any_thread: bool = False) -> sqlite3.Connection:
    """A read-only connection to a written ``index.sqlite`` (immutable: no locks, no journal)."""
    return sqlite3.connect(f"{Path(file).resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=not any_thread)
INDEX_UUID = "index.uuid"
_BLOCK = 512
#: bytes read at a time when checking that only zero padding follows a tar's end-of-archive marker
_TAIL_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """What indexing one tar found: sample offsets (plus the end), keys and part locations."""

    name: str
    offsets: Tuple[int, ...]
    keys: Tuple[str, ...]
    #: ``(sample_index, part_name, content_byte_offset, content_byte_size)`` per member.
    parts: Tuple[Tuple[int, str, int, int], ...]
    #: Members left out though they are no folder nor ``__meta__``-like: ``"'name' (why)"``, in tar order.
    skipped: Tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.keys)


#: Indexes the named shards of a dataset root (each with :func:`index_shard`, anywhere: a process
#: pool, Ray tasks) and yields their :class:`ShardIndex` in the order of the names.
ShardIndexer = Callable[[Path, List[str]], Iterable[ShardIndex]]


def find_shards(path: Path | str, exclude: Sequence[str] = ()) -> List[str]:
    """``**/*.tar`` and ``**/*.tgz`` under ``path`` (not hidden) as sorted relative names, minus ``exclude``.

    Raises:
        ValueError: if an exclude pattern is not a valid regex.
    """
    root = as_path(path)
    if isinstance(root, RemotePath):  # one listing; every object is a file
        found = [p.relative_to(root) for p, _ in root.walk_files() if p.name.endswith((".tar", ".tgz"))]
    else:
        found = [p.relative_to(root) for pattern in ("**/*.tar", "**/*.tgz") for p in root.glob(pattern) if p.is_file()]
    # Like Energon: hidden files and folders are not shards; order is by path components.
    found = sorted((p for p in found if not any(part.startswith(".") for part in p.parts)), key=lambda p: p.parts)
    names = [p.as_posix() for p in found]
    for pattern in exclude:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"exclude pattern {pattern!r} is not a valid regex: {exc}") from None
        names = [n for n in names if not regex.search(n)]
    return names


def linked_shard_folders(path: Path | str) -> List[Tuple[str, int]]:
    """Folders under a local ``path`` that are links to folders holding shards: ``find_shards`` does
    not follow them (as Energon's prepare does not), so their shards are not part of the dataset.
    ``(relative folder name, shards behind it)``; hidden ones left out, as ``find_shards`` does."""
    root = as_path(path)
    if isinstance(root, RemotePath):
        return []
    out = []
    for folder, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in dirs:
            link = Path(folder) / name
            if link.is_symlink():
                count = sum(1 for pattern in ("**/*.tar", "**/*.tgz") for p in link.glob(pattern) if p.is_file())
                if count:
                    out.append((link.relative_to(root).as_posix(), count))
    return sorted(out)


def _check_tar_end(file, path: Path | RemotePath, end: int) -> None:
    # tarfile silently stops at a corrupt header, which would hide the rest of the shard.
    raw = getattr(file, "raw", None)
    size = raw.size if isinstance(raw, RemoteFile) else os.fstat(file.fileno()).st_size
    if end > size:
        raise DatasetConfigError(f"{path}: truncated tar: the last member ends at byte {end}, the file has {size}")
    file.seek(end)
    block = file.read(_BLOCK)
    if block.strip(b"\0") and len(block) < _BLOCK:
        raise DatasetConfigError(f"{path}: truncated tar: the file ends inside the header at byte {end}")
    if block.strip(b"\0"):
        raise DatasetConfigError(f"{path}: invalid tar header at byte {end}; the shard is corrupt after that point")
    # tarfile also stops at the end-of-archive marker: a second tar appended with `cat` would be left out unsaid
    position = end + len(block)
    while chunk := file.read(_TAIL_CHUNK):
        if chunk.strip(b"\0"):
            found = position + len(chunk) - len(chunk.lstrip(b"\0"))
            raise DatasetConfigError(
                f"{path}: data at byte {found} follows the tar's end-of-archive marker (byte {end}), which tar "
                "readers stop at (tars joined with `cat`?); rebuild the shard as one tar, e.g. with `tar --concatenate`"
            )
        position += len(chunk)


def _skip_reason(member: tarfile.TarInfo, split: Optional[Tuple[str, str]]) -> Optional[str]:
    """Why a member is no sample part (``""``: a folder or ``__meta__``-like, left out as a matter of course),
    or None for a sample part."""
    if member.isdir() or SKIP_META_RE.match(member.name):
        return ""
    if not member.isreg():
        return "not a regular file"
    if split is None:
        if "." in member.name.rsplit("/", 1)[-1]:
            return "no sample key: the file name starts with a dot"
        return "no extension: a part is named by what follows the first dot of the file name"
    return None


def _open_shard(path: Path | RemotePath):
    """The shard opened for reading; a missing one is named as the listed shard it is (``--tar-index-only``
    indexes the shards ``.info.json`` lists), not as a bare ``No such file``."""
    try:
        return path.open("rb")
    except FileNotFoundError as exc:
        if isinstance(exc, BucketNotFoundError):  # a wrong URL, not a missing shard
            raise
        raise DatasetConfigError(
            f"{path}: shard does not exist (listed in .nv-meta/.info.json); restore it, or prepare the dataset "
            "again without it"
        ) from None


def index_shard(root: Path | str, name: str) -> ShardIndex:
    """Index one tar shard and write its ``.tar.idx``.

    A remote shard is read with ranged requests that stream it (the data of large members is skipped).

    Args:
        root: the dataset folder (or URL).
        name: the shard's path relative to ``root``.

    Returns:
        The shard's offsets, keys and part locations, and the members left out as no sample part
        (named in ``skipped``: e.g. ``000001`` without an extension, a symlink).

    Raises:
        DatasetConfigError: unreadable, compressed, corrupt or empty tar, a member name that is not
            UTF-8, a key split across runs, or an index path that leads outside ``root``.
    """
    path = as_path(root) / name
    offsets: List[int] = []
    keys: List[str] = []
    parts: List[Tuple[int, str, int, int]] = []
    first_seen: Dict[str, int] = {}
    sample_parts: Set[str] = set()  # the parts of the sample being read
    skipped: List[str] = []
    with _open_shard(path) as file:
        if file.read(2) == b"\x1f\x8b":
            raise DatasetConfigError(
                f"{path}: gzip-compressed shard; samples cannot be read by byte offset, decompress it to .tar"
            )
        file.seek(0)
        try:
            with tarfile.open(fileobj=file, mode="r:", **TAR_ENCODING) as tar:
                for member in tar:
                    raw = non_utf8_name(member.name)
                    if raw is not None:
                        raise DatasetConfigError(
                            f"{path}: member name {raw!r} is not valid UTF-8; rename it (sample keys and part "
                            f"names must be UTF-8 text)"
                        )
                    split = split_member_name(member.name)
                    reason = _skip_reason(member, split)
                    if reason is not None:
                        if reason:
                            skipped.append(f"{member.name!r} ({reason})")
                        continue
                    key, part = split
                    if not keys or keys[-1] != key:
                        if key in first_seen:
                            raise DatasetConfigError(
                                f"{path}: duplicate sample key {key!r} (samples #{first_seen[key]} and "
                                f"#{len(keys)}); the members of a sample must be consecutive"
                            )
                        first_seen[key] = len(keys)
                        offsets.append(member.offset)
                        keys.append(key)
                        sample_parts = set()
                    if part in sample_parts:
                        raise DatasetConfigError(
                            f"{path}: sample {key!r} (#{len(keys) - 1}) holds part {part!r} twice (member "
                            f"{member.name!r} at byte {member.offset}); a reader would keep only one of them"
                        )
                    sample_parts.add(part)
                    parts.append((len(keys) - 1, part, member.offset_data, member.size))
                end = tar.offset
        except tarfile.TarError as exc:
            raise DatasetConfigError(f"{path}: not a readable tar file: {exc}") from None
        _check_tar_end(file, path, end)
    if not keys:
        raise DatasetConfigError(f"{path}: shard holds no samples; remove it or drop it with --exclude")
    offsets.append(end)
    write_tar_index(path, offsets, root)
    if path.suffix == ".tgz" and not path.with_suffix(".tar").exists():
        write_tar_index(path.with_suffix(".tar"), offsets, root)  # megatron-energon names it x.tar.idx
    return ShardIndex(name=name, offsets=tuple(offsets), keys=tuple(keys), parts=tuple(parts), skipped=tuple(skipped))


def _index_shards(root: Path, names: List[str], num_workers: int, progress: bool) -> Iterator[ShardIndex]:
    workers = min(num_workers, len(names))
    pool = process_pool(workers) if workers > 1 else None  # before the bar (its monitor is a thread)
    bar = tqdm(total=len(names), desc="Indexing shards", unit="shard", disable=not progress)
    samples = 0
    try:
        for shard in (pool.map if pool else map)(index_shard, [root] * len(names), names):
            samples += shard.count
            bar.set_postfix(samples=samples, refresh=False)
            bar.update()
            yield shard
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _create_index_db(file: Path) -> sqlite3.Connection:
    file.unlink(missing_ok=True)
    db = sqlite3.connect(file, isolation_level=None)  # one explicit transaction, committed at the end
    db.execute(
        "CREATE TABLE samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
        "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)"
    )
    db.execute(
        "CREATE TABLE sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
        "content_byte_offset INTEGER, content_byte_size INTEGER)"
    )
    db.execute("BEGIN")
    return db


def _insert_shard(db: sqlite3.Connection, shard_id: int, shard: ShardIndex, names: List[str]) -> None:
    rows = [
        (shard_id, key, i, shard.offsets[i], shard.offsets[i + 1] - shard.offsets[i])
        for i, key in enumerate(shard.keys)
    ]
    db.execute("SAVEPOINT shard")
    try:
        db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?)", rows)
    except sqlite3.IntegrityError:
        db.execute("ROLLBACK TO SAVEPOINT shard")
        for key in shard.keys:
            hit = db.execute("SELECT tar_file_id FROM samples WHERE sample_key = ?", (key,)).fetchone()
            if hit is not None:
                raise DatasetConfigError(
                    f"duplicate sample key {key!r}: it is in shard {names[hit[0]]} and in shard {shard.name}; "
                    f"keys must be unique across the dataset (e.g. prefix members with the shard name)"
                ) from None
        raise
    db.execute("RELEASE SAVEPOINT shard")
    db.executemany("INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)", [(shard_id, *p) for p in shard.parts])


def _finish_index_db(db: sqlite3.Connection, tmp: Path, final: Path | RemotePath) -> None:
    db.execute("CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)")
    db.execute("CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)")
    db.execute(
        "CREATE INDEX idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
        "content_byte_offset, content_byte_size)"
    )
    db.execute("COMMIT")
    db.close()
    if isinstance(final, RemotePath):  # built in a local scratch file, then uploaded whole
        final.write_bytes(tmp.read_bytes())
        tmp.unlink()
    else:
        os.replace(tmp, final)


def scratch_folder(prefix: str, parent: Optional[Path | str] = None) -> str:
    """A new private folder where a remote dataset's ``index.sqlite`` is built before it is uploaded:
    under ``parent`` (made if missing; Energon's ``--tmp-path``) or the system's temporary folder."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=None if parent is None else str(parent))


def index_dataset(
    root: Path, names: List[str], *, num_workers: int = 1, progress: bool = True,
    shard_indexer: Optional[ShardIndexer] = None, skipped: Optional[List[str]] = None,
    scratch_dir: Optional[Path | str] = None,
) -> Tuple[Dict[str, int], Tuple[str, ...]]:
    """Index every shard (``.tar.idx``) and write ``.nv-meta/index.sqlite`` and ``index.uuid``.

    ``shard_indexer`` replaces the local process pool (``num_workers``, ``progress``): e.g. Ray tasks
    (``jobs/prepare_job.py``); the files written are the same, since only the per-shard work moves.
    ``skipped``, when given, receives each member left out as no sample part (``"shard: 'member' (why)"``),
    so a caller can count and report them. ``scratch_dir``: where a remote dataset's ``index.sqlite``
    is built before it is uploaded (a new folder inside it, removed after; default: the system's
    temporary folder).

    Returns:
        ``({shard name: sample count} in ``names`` order, sorted part names)``.

    Raises:
        DatasetConfigError: a bad shard, a sample key found in two places (both named), or an output
            path that leads outside ``root`` (see :func:`~energon_ray.format.info.check_write_target`).
    """
    meta = check_write_target(root, meta_dir(root))
    for file in (INDEX_SQLITE, INDEX_SQLITE + ".tmp", INDEX_UUID):
        check_write_target(root, meta / file)
    meta.mkdir(parents=True, exist_ok=True)
    scratch = scratch_folder("energon_ray_index_", scratch_dir) if isinstance(meta, RemotePath) else None
    tmp = Path(scratch) / INDEX_SQLITE if scratch else meta / (INDEX_SQLITE + ".tmp")
    db = _create_index_db(tmp)
    counts: Dict[str, int] = {}
    part_types: set = set()
    try:
        shards = (shard_indexer(root, names) if shard_indexer is not None
                  else _index_shards(root, names, num_workers, progress))  # fmt: skip
        for shard_id, shard in enumerate(shards):
            if shard_id >= len(names) or shard.name != names[shard_id]:
                raise RuntimeError(f"the shard indexer yielded {shard.name!r} as shard #{shard_id} of {names}")
            _insert_shard(db, shard_id, shard, names)
            counts[shard.name] = shard.count
            if skipped is not None:
                skipped.extend(f"{shard.name}: {entry}" for entry in shard.skipped)
            if len(part_types) < 1000:
                part_types.update(p[1] for p in shard.parts)
        if len(counts) != len(names):
            raise RuntimeError(f"the shard indexer yielded {len(counts)} of {len(names)} shards")
        _finish_index_db(db, tmp, meta / INDEX_SQLITE)
        write_file(root, meta / INDEX_UUID, str(uuid.uuid4()).encode())
    except BaseException:
        db.close()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return counts, tuple(sorted(part_types))
