"""``.nv-meta/.info.json`` (and legacy ``.info.yaml``): per-shard sample counts, in shard order.

Also the write guard of ``energon-ray prepare``: it writes only inside the dataset folder, never
through a symlink. Paths may be local or remote (``s3://``, ``msc://``: see :mod:`energon_ray.storage`).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

import yaml

from energon_ray.errors import DatasetConfigError, parse_problem
from energon_ray.format import energon_yaml
from energon_ray.storage import RemotePath, as_path

META_DIR = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"


def meta_dir(path: Path | str | RemotePath) -> Path | RemotePath:
    """The ``.nv-meta`` folder of a dataset."""
    return as_path(path) / META_DIR


def check_write_target(root: Path | str, path: Path | str) -> Path:
    """``path``, if prepare may write it: not a symlink, not under a symlinked ``.nv-meta``, inside ``root``.

    A remote target (object stores have no symlinks) must lie under the remote ``root``.

    Raises:
        DatasetConfigError: naming ``path`` and where it would lead.
    """
    if isinstance(as_path(root), RemotePath) or isinstance(path, RemotePath):
        target = as_path(path, getattr(as_path(root), "settings", None))
        if isinstance(target, RemotePath) and target.is_relative_to(as_path(root)):
            return target
        raise DatasetConfigError(f"{target}: outside the dataset location {root}; prepare refuses to write it")
    target, meta = Path(path), meta_dir(root)
    inside = Path(root).resolve()
    if target.is_symlink():
        why = f"it is a symlink to {os.readlink(target)}"
    elif meta.is_symlink() and (target == meta or meta in target.parents):
        why = f"{META_DIR} is a symlink to {os.readlink(meta)}"
    elif not target.resolve().is_relative_to(inside):
        why = f"it resolves to {target.resolve()}"
    else:
        return target
    raise DatasetConfigError(
        f"{target}: {why}; prepare refuses to write through a symlink outside the dataset folder {inside}"
    )


def write_file(root: Path | str, path: Path | str, data: bytes) -> Path:
    """Write ``path`` inside ``root`` (see :func:`check_write_target`): a new temp file, then a rename
    (remote: one upload, which object stores make visible atomically)."""
    target = check_write_target(root, path)
    if isinstance(target, RemotePath):
        target.write_bytes(data)
        return target
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # O_EXCL: never opens an existing link
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _count(file: Path, shard: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DatasetConfigError(
            f"{file}: shard_counts[{shard!r}] is {value!r}; a sample count must be a whole number >= 0 "
            f"(re-run `energon-ray prepare --force-overwrite {file.parent.parent}` to rewrite it)"
        )
    return value


def read_info(path: Path | str) -> Dict[str, int]:
    """Shard counts ``{relative shard path: sample count}`` in the order that defines shard ids.

    Raises:
        DatasetConfigError: if the dataset has no ``.nv-meta`` or no readable info file.
    """
    root = as_path(path)
    meta = meta_dir(root)
    if not root.exists():
        raise DatasetConfigError(f"{root}: dataset path does not exist")
    if not meta.is_dir():
        raise DatasetConfigError(
            f"{root}: not a prepared dataset (missing {META_DIR}/); run `energon-ray prepare {root}`"
        )
    for name, loader in ((INFO_JSON, json.loads), (INFO_YAML, energon_yaml.load)):
        file = meta / name
        if file.is_file():
            try:
                data = loader(file.read_text())
            except Exception as exc:
                raise DatasetConfigError(f"{file}: cannot parse: {parse_problem(exc)}") from None
            counts = data.get("shard_counts") if isinstance(data, dict) else None
            if not isinstance(counts, dict):
                raise DatasetConfigError(f"{file}: has no 'shard_counts' mapping")
            return {str(k): _count(file, str(k), v) for k, v in counts.items()}
    raise DatasetConfigError(f"{meta}: neither {INFO_JSON} nor {INFO_YAML} exists; run `energon-ray prepare`")


def write_info(path: Path | str, shard_counts: Dict[str, int], version: Optional[str] = None) -> Path:
    """Write ``.info.json`` (and refresh a legacy ``.info.yaml`` if one exists), never through a symlink."""
    meta = check_write_target(path, meta_dir(path))
    meta.mkdir(parents=True, exist_ok=True)
    data = {"energon_version": version, "shard_counts": dict(shard_counts)}
    out = write_file(path, meta / INFO_JSON, json.dumps(data, indent=2).encode())
    legacy = meta / INFO_YAML
    if legacy.exists() or legacy.is_symlink():
        write_file(path, legacy, yaml.safe_dump(data, sort_keys=False).encode())
    return out
