"""A metadataset's ``aux:`` references (resolved to paths by ``energon_ray.blend.metadataset``) →
named file stores for the cook functions.

A plain path names a prepared dataset (a folder holding ``.nv-meta/.info.json`` or ``.info.yaml``,
and the ``index.sqlite`` its files are looked up in; files by ``"<key>.<part>"``); a folder that is
none, or lacks the index, is refused, as Energon refuses it. A folder
written ``filesystem://…`` (a prepared one too, as Energon's ``SystemFileStore``; its
``.nv-meta/index.sqlite`` may hold media metadata from ``prepare-media``) is read by relative file
path. Either may be local or on an object store (``s3://``, ``msc://``, ``filesystem+s3://``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Dict, Mapping

from energon_ray.cache.base import FileStore
from energon_ray.cache.stores import DatasetFileStore, SystemFileStore
from energon_ray.errors import DatasetConfigError
from energon_ray.format.indexer import INDEX_SQLITE
from energon_ray.format.info import INFO_JSON, INFO_YAML, META_DIR
from energon_ray.storage import RemotePath, StorageError, as_path

#: keyword arguments the loader adds itself
RESERVED = ("cache", "primary")


def aux_stores(refs: Mapping[str, Any], where: str, filesystem: Collection[str] = ()) -> Dict[str, FileStore]:
    """The store of each ``aux:`` entry, by its name.

    Args:
        refs: name → resolved path (``LeafSpec.aux``), or name → ``FileStore``.
        where: ``"file: splits.train"`` for messages.
        filesystem: the names written ``filesystem://…`` (``LeafSpec.filesystem_aux``): their folder's
            files by path, even where it is a prepared dataset.

    Raises:
        DatasetConfigError: a reserved or non-identifier name, a path that does not exist, a plain
            path to a folder that is no prepared dataset, or an object store that cannot be reached.
    """
    out: Dict[str, FileStore] = {}
    for name, ref in (refs or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
            raise DatasetConfigError(
                f"{where}: aux name {name!r} must be a Python identifier other than {', '.join(RESERVED)} "
                "(it becomes a keyword argument of the cook function)"
            )
        if isinstance(ref, FileStore):
            out[name] = ref
            continue
        if not isinstance(ref, (str, Path, RemotePath)):
            raise DatasetConfigError(f"{where}: aux.{name}: expected a path, URL or FileStore, got {type(ref).__name__}")
        path = as_path(ref)
        try:
            out[name] = _store(path, f"{where}: aux.{name}", by_path=name in filesystem)
        except StorageError as exc:
            raise DatasetConfigError(f"{where}: aux.{name}: cannot reach {path}: {exc}") from None
    return out


def _store(path: Any, where: str, by_path: bool) -> FileStore:
    """A folder's files by path (``filesystem://``), else the prepared dataset there, as Energon's
    aux references: a plain path to a folder that is no prepared dataset is refused (Energon asserts)."""
    if not by_path and any((path / META_DIR / info).is_file() for info in (INFO_JSON, INFO_YAML)):
        _check_index(path, where)
        return DatasetFileStore(path)
    if not path.is_dir():
        raise DatasetConfigError(f"{where}: {path} is neither a prepared dataset nor a folder")
    if not by_path:
        raise DatasetConfigError(
            f"{where}: {path} is a folder but no prepared dataset (no {META_DIR}/{INFO_JSON}); a plain aux path "
            f"names a prepared dataset, as in Energon: prepare it (energon-ray prepare {path}), or write it "
            "filesystem://<path> to read the folder's files by relative path"
        )
    return SystemFileStore(path)


def check_primary_index(root: Any) -> None:
    """A prepared (tar) dataset cooked by a ``need_primary`` cooker reads its own files by name through
    its ``index.sqlite``: refused where the dataset is built when it has none, as Energon refuses it
    (not each sample's cooking, in Ray tasks).

    Raises:
        DatasetConfigError: naming the dataset's folder, the missing file and how to write it.
    """
    index = root / META_DIR / INDEX_SQLITE
    if not index.is_file():
        raise DatasetConfigError(
            f"{root}: a cooker that needs primary= reads the dataset's own files by name through {index}, which is "
            f"missing, as Energon refuses it: write it with energon-ray prepare {root}"
        )


def _check_index(path: Any, where: str) -> None:
    """A prepared dataset read by name needs its ``index.sqlite``: refused here, where the dataset is
    built, as Energon asserts it, not at the cooker's first read in a Ray task."""
    index = path / META_DIR / INDEX_SQLITE
    if not index.is_file():
        raise DatasetConfigError(
            f"{where}: {path} is a prepared dataset without its index ({index} is missing), which a plain aux path "
            f"reads files by name through, as in Energon: write it with energon-ray prepare {path}, or write the aux "
            "filesystem://<path> to read the folder's files by relative path"
        )
