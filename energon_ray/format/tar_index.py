"""``<shard>.tar.idx``: native-endian uint64 byte offsets of each sample's first header, plus the end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from energon_ray.errors import DatasetConfigError
from energon_ray.format.info import META_DIR, write_file
from energon_ray.storage import RemotePath, as_path, is_remote, settings_of

INDEX_SUFFIX = ".idx"
#: Offsets are stored as uint64 but used as int64 (numpy, ``os.pread``): larger values are corrupt.
MAX_OFFSET = 2**63


def index_path(shard_path: Path | str | RemotePath) -> Path | RemotePath:
    """The index file next to a shard: ``shard.tar`` → ``shard.tar.idx``."""
    return as_path(str(shard_path) + INDEX_SUFFIX, settings_of(shard_path))


def energon_tgz_index_path(shard_path: Path | str | RemotePath) -> Optional[Path | RemotePath]:
    """Where megatron-energon keeps the index of a ``.tgz`` shard: ``x.tgz`` → ``x.tar.idx`` (our prepare
    writes both names; Energon's only this one). None for other shards, and when ``x.tar`` is a shard
    of its own, whose index that file is."""
    name = str(shard_path)
    if not name.endswith(".tgz"):
        return None
    tar = as_path(name[: -len(".tgz")] + ".tar", settings_of(shard_path))
    return None if tar.exists() else index_path(tar)


def rebuild_command(shard_path: Path | str | RemotePath, root: Optional[Path | str] = None) -> str:
    """The command that rewrites a shard's lost or broken index.

    A ``.jsonl`` file is prepared on its own; a tar shard's index is rebuilt with ``--tar-index-only``,
    because plain ``prepare`` refuses a dataset that already has ``.nv-meta``. ``root`` (the dataset
    folder) is looked up above a local shard when not given.
    """
    if str(shard_path).endswith(".jsonl"):
        return f"energon-ray prepare {shard_path}"
    if root is None and not is_remote(shard_path):
        root = next((p for p in Path(shard_path).absolute().parents if (p / META_DIR).is_dir()), None)
    return f"energon-ray prepare --tar-index-only {root if root is not None else '<dataset root>'}"


def _read_if_exists(path: Path | RemotePath) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _missing_index(path: Path | RemotePath, shard_path: Path | str, root: Optional[Path | str]) -> DatasetConfigError:
    """The error for a shard without its index: a rebuild fixes that only while the shard itself is there."""
    if not as_path(shard_path, settings_of(shard_path)).exists():
        return DatasetConfigError(
            f"{shard_path}: shard listed in .nv-meta/.info.json does not exist (nor its index {path}); restore it, "
            "or prepare the dataset again without it"
        )
    return DatasetConfigError(f"{path}: missing index of {shard_path}; run `{rebuild_command(shard_path, root)}` to rebuild it")


def read_tar_index(shard_path: Path | str, root: Optional[Path | str] = None) -> np.ndarray:
    """Read the ``count + 1`` offsets of a shard's index (``root``, the dataset folder, only goes into messages).

    A ``.tgz`` shard prepared by megatron-energon has its index under Energon's name (see
    :func:`energon_tgz_index_path`), which is read when ``x.tgz.idx`` is missing.

    Raises:
        DatasetConfigError: if the shard or its index is missing, the index not a whole number of uint64
            values, or holds a value of 2**63 or more (no file is that large: a corrupt index, which int64 would wrap).
    """
    path = index_path(shard_path)
    raw = _read_if_exists(path)
    if raw is None:
        energon_name = energon_tgz_index_path(shard_path)
        raw = _read_if_exists(energon_name) if energon_name is not None else None
        if raw is None:
            raise _missing_index(path, shard_path, root)
        path = energon_name
    if len(raw) % 8 != 0 or len(raw) < 8:
        raise DatasetConfigError(f"{path}: {len(raw)} bytes is not a valid .tar.idx (count+1 uint64 offsets)")
    values = np.frombuffer(raw, dtype=np.uint64)
    too_large = np.flatnonzero(values >= np.uint64(MAX_OFFSET))
    if too_large.size:
        entry = int(too_large[0])
        raise DatasetConfigError(
            f"{path}: entry #{entry} of {len(values)} is {int(values[entry])}, not a byte offset (offsets are below "
            f"2**63); the index is corrupt: run `{rebuild_command(shard_path, root)}` to rebuild it"
        )
    return values.astype(np.int64)


def write_tar_index(shard_path: Path | str, offsets: Sequence[int], root: Optional[Path | str] = None) -> Path:
    """Write the offsets atomically, never through a symlink nor outside ``root`` (default: the shard's folder).

    Raises:
        DatasetConfigError: if the index path is a symlink or leads outside ``root``.
    """
    path = index_path(shard_path)
    return write_file(path.parent if root is None else root, path, np.asarray(offsets, dtype=np.uint64).tobytes())


def check_tar_index(shard_path: Path | str, offsets: np.ndarray, expected_count: int) -> None:
    """Fail fast when an index disagrees with its tar or with ``.info.json``.

    Raises:
        DatasetConfigError: naming the shard, its index and the mismatching values.
    """
    idx = index_path(shard_path)
    count = len(offsets) - 1
    if count != expected_count:
        raise DatasetConfigError(
            f"{idx}: index lists {count} samples but .nv-meta/.info.json says {expected_count} for {shard_path}"
        )
    if count and np.any(np.diff(offsets) <= 0):
        raise DatasetConfigError(f"{idx}: offsets are not strictly increasing")
    try:
        size = as_path(shard_path).stat().st_size if is_remote(shard_path) else os.path.getsize(shard_path)
    except FileNotFoundError:
        raise DatasetConfigError(f"{shard_path}: shard listed in .nv-meta/.info.json does not exist") from None
    if int(offsets[-1]) > size:
        raise DatasetConfigError(
            f"{shard_path}: tar is truncated or does not match {idx}: the index ends at byte "
            f"{int(offsets[-1])} but the file has {size} bytes"
        )
