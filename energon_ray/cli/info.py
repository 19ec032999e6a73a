"""``energon-ray info PATH``: counts, size, sample type and splits of a prepared dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import braceexpand
import click
import yaml

from energon_ray.cli.params import DatasetLocation, user_errors
from energon_ray.errors import DatasetConfigError, UntrustedCodeError, parse_problem
from energon_ray.format import energon_yaml
from energon_ray.format.dataset_code import named_sample_type
from energon_ray.format.info import INFO_JSON, INFO_YAML, meta_dir, read_info
from energon_ray.format.split import read_split_file
from energon_ray.storage import RemotePath

_ORDER = ("train", "val", "test")


def format_size(size: float) -> str:
    """Bytes in binary units.

    Example:
        >>> format_size(51200)
        '50.00 KiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} PiB"


def _energon_version(path: Path | RemotePath) -> str:
    for name, loader in ((INFO_JSON, json.loads), (INFO_YAML, energon_yaml.load)):
        file = meta_dir(path) / name
        if file.is_file():
            return str((loader(file.read_text()) or {}).get("energon_version") or "unknown")
    return "unknown"


def _sample_type(path: Path | RemotePath, dataset_config: str) -> str:
    """One line about ``dataset.yaml``: the sample class and how fields are mapped."""
    file = meta_dir(path) / dataset_config
    if not file.is_file():
        return f"none (no .nv-meta/{dataset_config})"
    try:
        data = energon_yaml.load(file.read_text()) or {}  # the values the loader reads, not YAML 1.1's
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{file}: cannot parse: {parse_problem(exc)}") from None
    if not isinstance(data, dict):
        raise click.ClickException(f"{file}: expected a mapping of keys (sample_type, field_map, ...), got a {type(data).__name__}")
    spec = data.get("sample_type") if isinstance(data.get("sample_type"), dict) else data
    if not isinstance(spec, dict) or "__class__" not in spec:
        return f"unknown ({file} has no sample_type)"
    try:  # a class the loader refuses (e.g. a misspelt sample class) is an error here too, not a plain report
        named_sample_type(dict(data), str(file), trusted=False)
    except UntrustedCodeError:
        pass  # a class of another module: the loader imports it only with trust_dataset_code
    except DatasetConfigError as exc:
        raise click.ClickException(str(exc)) from None
    out = f"{spec.get('__module__', 'megatron.energon')}.{spec['__class__']}"
    if isinstance(data.get("field_map"), dict):
        out += " (field_map: " + ", ".join(f"{k}={v}" for k, v in data["field_map"].items()) + ")"
    elif data.get("sample_loader"):
        out += f" (sample_loader: {data['sample_loader']})"
    return out


def _split_rows(split: dict, counts: Dict[str, int]) -> List[Tuple[str, int, int, List[str]]]:
    """``(part, shards, samples, unknown shards)`` per split part, train/val/test first."""
    excluded = {e for pattern in split.get("exclude") or [] for e in braceexpand.braceexpand(str(pattern))}
    rows = []
    parts = sorted(split["split_parts"].items(), key=lambda kv: _ORDER.index(kv[0]) if kv[0] in _ORDER else 3)
    for part, patterns in parts:
        shards = [n for p in patterns or [] for n in braceexpand.braceexpand(str(p)) if n not in excluded]
        unknown = [n for n in shards if n not in counts]
        rows.append((part, len(shards), sum(counts.get(n, 0) for n in shards), unknown))
    return rows


def _shard_sizes(path: Path | RemotePath, counts: Dict[str, int]) -> List[int]:
    """Sizes of the listed shards that exist (remote: one listing, not a request per shard)."""
    if isinstance(path, RemotePath):
        found = {str(p.relative_to(path)): size for p, size in path.walk_files()}
        return [found[n] for n in counts if n in found]
    return [(path / n).stat().st_size for n in counts if (path / n).is_file()]


@click.command(name="info")
@click.argument("path", type=DatasetLocation())
@click.option("--split-config", default="split.yaml", show_default=True, help="Split config file in .nv-meta.")
@click.option("--dataset-config", default="dataset.yaml", show_default=True, help="Dataset config file in .nv-meta.")
def info_command(path: Path, split_config: str, dataset_config: str) -> None:
    """Show sample counts, size on disk, sample type and split parts of the dataset at PATH (a folder,
    or an s3:// or msc:// URL)."""
    if isinstance(path, Path) and path.is_file():  # click's own message was "Directory 'x.yaml' is a file."
        raise click.UsageError(f"{path}: PATH must be a prepared dataset folder, not a file (info reads no "
                               "metadataset YAML or .jsonl file; `energon-ray preview` and `lint` read a .jsonl)")  # fmt: skip
    with user_errors():
        counts = read_info(path)
        split = read_split_file(path, split_config)
        sizes = _shard_sizes(path, counts)
        version, sample_type = _energon_version(path), _sample_type(path, dataset_config)
    total = sum(counts.values())
    missing = len(counts) - len(sizes)
    lines = [
        f"Dataset {path.resolve().name} ({path})",
        f"  Samples: {total:,} in {len(counts)} shards, {format_size(sum(sizes))} on disk"
        + (f" ({missing} shards missing!)" if missing else ""),
        f"  Prepared with energon version: {version}",
        f"  Sample type: {sample_type}",
        f"  Split parts ({split_config}):",
    ]
    for part, shards, samples, unknown in _split_rows(split, counts):
        ratio = 100 * samples / total if total else 0.0
        lines.append(f"    {part}: {ratio:.1f}%, {samples:,} samples in {shards} shards")
        if unknown:
            lines.append(f"      {len(unknown)} shards not in .info.json, e.g. {unknown[0]}")
    sample_excludes = [e for e in split.get("exclude") or [] if e not in counts and "/" in str(e)]
    if split.get("exclude"):
        lines.append(f"  Excludes: {len(split['exclude'])} entries ({len(sample_excludes)} sample-level)")
    click.echo("\n".join(lines))
