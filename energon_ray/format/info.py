"""``.nv-meta/.info.json`` (and legacy ``.info.yaml``): per-shard sample counts, in shard order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import yaml

from energon_ray.errors import DatasetConfigError

META_DIR = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"


def meta_dir(path: Path | str) -> Path:
    """The ``.nv-meta`` folder of a dataset."""
    return Path(path) / META_DIR


def read_info(path: Path | str) -> Dict[str, int]:
    """Shard counts ``{relative shard path: sample count}`` in the order that defines shard ids.

    Raises:
        DatasetConfigError: if the dataset has no ``.nv-meta`` or no readable info file.
    """
    root = Path(path)
    meta = meta_dir(root)
    if not root.exists():
        raise DatasetConfigError(f"{root}: dataset path does not exist")
    if not meta.is_dir():
        raise DatasetConfigError(
            f"{root}: not a prepared dataset (missing {META_DIR}/); run `energon-ray prepare {root}`"
        )
    for name, loader in ((INFO_JSON, json.loads), (INFO_YAML, yaml.safe_load)):
        file = meta / name
        if file.is_file():
            try:
                data = loader(file.read_text())
            except Exception as exc:
                raise DatasetConfigError(f"{file}: cannot parse: {exc}") from None
            counts = (data or {}).get("shard_counts")
            if not isinstance(counts, dict):
                raise DatasetConfigError(f"{file}: has no 'shard_counts' mapping")
            return {str(k): int(v) for k, v in counts.items()}
    raise DatasetConfigError(f"{meta}: neither {INFO_JSON} nor {INFO_YAML} exists; run `energon-ray prepare`")


def write_info(path: Path | str, shard_counts: Dict[str, int], version: Optional[str] = None) -> Path:
    """Write ``.info.json`` (and refresh a legacy ``.info.yaml`` if one exists)."""
    meta = meta_dir(path)
    meta.mkdir(parents=True, exist_ok=True)
    data = {"energon_version": version, "shard_counts": dict(shard_counts)}
    out = meta / INFO_JSON
    out.write_text(json.dumps(data, indent=2))
    legacy = meta / INFO_YAML
    if legacy.exists():
        legacy.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
