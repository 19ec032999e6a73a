"""``.nv-meta/split.yaml``: which shards form each split part, and what is excluded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, FrozenSet, List, Tuple

import braceexpand
import yaml

from energon_ray.errors import DatasetConfigError
from energon_ray.format.info import check_write_target, meta_dir, write_file


@dataclasses.dataclass(frozen=True)
class SplitPart:
    """The shards of one split part (in split-file order) and the sample-level excludes."""

    name: str
    shards: Tuple[str, ...]
    #: ``"shard name/sample key"`` entries whose samples are dropped when read.
    sample_excludes: FrozenSet[str]


def _expand(patterns: List[str]) -> List[str]:
    return [name for pattern in patterns for name in braceexpand.braceexpand(str(pattern))]


def read_split_file(path: Path | str, split_config: str = "split.yaml") -> Dict:
    """Parse the split file (``split.json`` is accepted when ``split.yaml`` is absent)."""
    meta = meta_dir(path)
    file = meta / split_config
    if not file.is_file() and split_config == "split.yaml" and (meta / "split.json").is_file():
        file = meta / "split.json"
    if not file.is_file():
        raise DatasetConfigError(f"{file}: split file not found")
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except Exception as exc:
        raise DatasetConfigError(f"{file}: cannot parse: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("split_parts"), dict):
        raise DatasetConfigError(f"{file}: has no 'split_parts' mapping")
    for name, patterns in data["split_parts"].items():
        _check_patterns(file, f"split_parts[{name!r}]", patterns)
    _check_patterns(file, "exclude", data.get("exclude"))
    data.setdefault("exclude", [])
    data["__file__"] = str(file)
    return data


def _check_patterns(file: Path, where: str, patterns: object) -> None:
    """``patterns`` must be a list of shard names or brace patterns (or empty): a plain string would
    be read letter by letter, an exclude silently not applied."""
    if patterns is None:
        return
    if not isinstance(patterns, list):
        hint = f"; write it as a YAML list: [{patterns}]" if isinstance(patterns, str) else ""
        raise DatasetConfigError(
            f"{file}: {where} must be a list of shard names or patterns, got {type(patterns).__name__} {patterns!r}{hint}"
        )
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise DatasetConfigError(f"{file}: {where} holds {pattern!r} ({type(pattern).__name__}); every entry must be a string")


def resolve_split_part(
    path: Path | str, split_part: str, shard_counts: Dict[str, int], split_config: str = "split.yaml"
) -> SplitPart:
    """Expand the shard patterns of ``split_part`` and apply ``exclude``.

    Raises:
        DatasetConfigError: unknown split part, empty split part, or a shard the info file lacks.
    """
    data = read_split_file(path, split_config)
    file = data["__file__"]
    parts = data["split_parts"]
    if split_part not in parts:
        raise DatasetConfigError(
            f"{file}: unknown split part {split_part!r}; the file defines {sorted(parts)}"
        )
    excludes = set(_expand(data.get("exclude") or []))
    shards = [name for name in _expand(parts[split_part] or []) if name not in excludes]
    if not shards:
        raise DatasetConfigError(f"{file}: split part {split_part!r} has no shards (after excludes)")
    for name in shards:
        if name not in shard_counts:
            raise DatasetConfigError(
                f"{file}: split part {split_part!r} names shard {name!r}, which .nv-meta/.info.json does not list"
            )
    return SplitPart(
        name=split_part,
        shards=tuple(shards),
        sample_excludes=frozenset(e for e in excludes if e not in shard_counts and "/" in e),
    )


def write_split_file(
    path: Path | str, split_parts: Dict[str, List[str]], exclude: List[str] | None = None,
    split_config: str = "split.yaml",
) -> Path:
    """Write ``split.yaml`` with the given shard lists (names relative to the dataset root), never
    through a symlink out of the dataset folder."""
    meta = check_write_target(path, meta_dir(path))
    meta.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"split_parts": split_parts, "exclude": list(exclude or [])}, sort_keys=False)
    return write_file(path, meta / split_config, text.encode())
