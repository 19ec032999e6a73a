"""Index tar shards and write ``.nv-meta`` (``energon-ray prepare``), in Energon's on-disk format.

Per shard: ``<shard>.tar.idx``. Per dataset: ``.nv-meta/.info.json``, ``split.yaml``,
``dataset.yaml``, ``index.sqlite`` (key → byte range, for random access by key) and ``index.uuid``.
Both energon_ray and megatron-energon load the result.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import random
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import braceexpand

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset_yaml import _check_field_map, write_dataset_yaml
from energon_ray.format.info import (
    INFO_JSON, INFO_YAML, check_write_target, meta_dir, read_info, write_file, write_info,
)  # fmt: skip
from energon_ray.format.split import write_split_file
from energon_ray.format.indexer import INDEX_SQLITE, INDEX_UUID, ShardIndex, find_shards, index_dataset, index_shard, linked_shard_folders  # noqa: F401
from energon_ray.format.indexer import ShardIndexer
from energon_ray.format.media_index import MediaFilter, write_media_metadata
from energon_ray.samples import SAMPLE_TYPES
from energon_ray.storage import as_path

#: The megatron-energon release whose on-disk format this module writes.
ENERGON_FORMAT_VERSION = "7.4.1"
SAMPLE_LOADER_FILE = "sample_loader.py"
SPLIT_FILE = "split.yaml"
CRUDE = "CrudeWebdataset"
RATIO_PARTS = ("train", "val", "test")
_BLOCK = 512
_NUMBER_RE = re.compile(r"^(.*?)(\d+)(\D*)$")


def package_version() -> str:
    """energon-ray's version (``"dev"`` when the package is not installed)."""
    try:
        return importlib.metadata.version("energon-ray")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def energon_version_string() -> str:
    """The ``energon_version`` of ``.info.json``: Energon's format version, our version as a PEP 440 local label."""
    return f"{ENERGON_FORMAT_VERSION}+energonray.{re.sub(r'[^0-9A-Za-z]+', '.', package_version())}"


@dataclasses.dataclass(frozen=True)
class PrepareResult:
    """What ``prepare_dataset`` wrote."""

    root: Path
    shard_counts: Dict[str, int]
    #: Split part → shard names (expanded; empty when only the tar index was rebuilt).
    split_parts: Dict[str, List[str]]
    #: Part names (``jpg``, ``txt``…) seen in the shards.
    part_types: Tuple[str, ...]
    dataset_config: Optional[Path] = None
    sample_loader: Optional[Path] = None
    warnings: Tuple[str, ...] = ()
    #: Media files whose metadata went into ``index.sqlite`` (``None``: no ``media_filter`` given).
    media_metadata: Optional[int] = None

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def already_prepared(path: Path | str) -> Optional[Path]:
    """The existing ``.nv-meta/.info.json`` (or legacy ``.info.yaml``) of a dataset, or None."""
    for name in (INFO_JSON, INFO_YAML):
        file = meta_dir(path) / name
        if file.is_file():
            return file
    return None


def split_by_ratio(
    names: Sequence[str], ratio: Sequence[float], shuffle: bool = False, parts: Sequence[str] = RATIO_PARTS, seed: int = 42
) -> Dict[str, List[str]]:
    """Whole shards to train/val/test (or ``parts``): cut points ``int(n * cumulative normalised ratio)``;
    ``shuffle`` shuffles the shards first with ``random.Random(seed)``.

    As in Energon, except that the last part always ends at ``n``: Energon's float sum can end
    just below 1 (e.g. ratio ``0.1,0.2,0.3``) and then silently drops the last shard.

    Example:
        >>> split_by_ratio(["a.tar", "b.tar", "c.tar"], [8, 1, 1])
        {'train': ['a.tar', 'b.tar'], 'val': [], 'test': ['c.tar']}
    """
    order = list(names)
    if shuffle:
        random.Random(seed).shuffle(order)
    total = float(sum(ratio))
    out, start, cumulative = {}, 0, 0.0
    for i, (part, value) in enumerate(zip(parts, ratio)):
        cumulative += value / total
        end = len(order) if i == len(parts) - 1 else int(len(order) * cumulative)
        out[part] = order[start:end]
        start = end
    return out


def split_by_patterns(names: Sequence[str], patterns: Mapping[str, Sequence[str]]) -> Dict[str, List[str]]:
    """Each part gets the shards (in ``names`` order) that a brace-expanded regex ``re.match``-es.

    Example:
        >>> split_by_patterns(["tr_0.tar", "tr_1.tar", "va_0.tar"], {"train": ["tr_.*"], "val": ["va_{0,9}"]})
        {'train': ['tr_0.tar', 'tr_1.tar'], 'val': ['va_0.tar']}
    """
    out = {}
    for part, part_patterns in patterns.items():
        regexes = [re.compile(e) for p in part_patterns for e in braceexpand.braceexpand(p)]
        out[part] = [n for n in names if any(r.match(n) for r in regexes)]
    return out


def collapse_names(names: Sequence[str]) -> List[str]:
    """Brace-collapse runs of consecutively numbered names, keeping order.

    Example:
        >>> collapse_names(["s/a_00.tar", "s/a_01.tar", "s/a_02.tar", "s/b.tar"])
        ['s/a_{00..02}.tar', 's/b.tar']
    """
    out: List[str] = []
    run: List[Tuple[str, str, str]] = []  # (prefix, digits, suffix) of the current run

    def flush() -> None:
        if len(run) > 1:
            out.append(f"{run[0][0]}{{{run[0][1]}..{run[-1][1]}}}{run[0][2]}")
        else:
            out.extend(p + d + s for p, d, s in run)
        run.clear()

    for name in names:
        match = _NUMBER_RE.match(name)
        if match is None or any(c in name for c in "{},"):
            flush()
            out.append(name)
            continue
        prefix, digits, suffix = match.groups()
        last = run[-1] if run else None
        if not (last and last[0] == prefix and last[2] == suffix and len(last[1]) == len(digits)
                and int(last[1]) + 1 == int(digits)):  # fmt: skip
            flush()
        run.append((prefix, digits, suffix))
    flush()
    return out


def check_ratio(split_ratio: Sequence[float]) -> Tuple[float, ...]:
    """``split_ratio`` as 3 finite numbers >= 0 with a positive sum (ValueError otherwise)."""
    try:
        values = tuple(float(v) for v in split_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"split_ratio must be 3 numbers (train, val, test), got {split_ratio!r}") from None
    if len(values) != len(RATIO_PARTS):
        raise ValueError(f"split_ratio must have 3 entries (train, val, test), got {list(values)}")
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(f"split_ratio entries must be >= 0 with a positive sum, got {list(values)}")
    return values


def _check_split_parts(split_parts: Mapping[str, Sequence[str]]) -> Dict[str, List[str]]:
    if not isinstance(split_parts, Mapping) or not split_parts:
        raise ValueError(f"split_parts must map part names to regex lists, got {split_parts!r}")
    out = {}
    for part, patterns in split_parts.items():
        patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
        if not isinstance(part, str) or not part or not patterns:
            raise ValueError(f"split_parts[{part!r}]: needs a non-empty name and at least one pattern")
        for pattern in patterns:
            for expanded in braceexpand.braceexpand(str(pattern)):
                try:
                    re.compile(expanded)
                except re.error as exc:
                    raise ValueError(f"split_parts[{part!r}]: {pattern!r} is not a valid regex: {exc}") from None
        out[part] = [str(p) for p in patterns]
    return out


def check_sample_config(
    sample_type: Optional[str], field_map: Optional[Mapping[str, str]]
) -> Optional[Dict[str, List[List[str]]]]:
    """Validate a sample type name and field map before anything is written.

    Returns:
        The parsed field map (``{field: [[part, key...], ...alternatives]}``) or None.

    Raises:
        ValueError: unknown sample type, a field map without type or for ``CrudeWebdataset``,
            a field the type lacks, an unmapped required field, or bad field-access syntax.
    """
    if sample_type is None:
        if field_map is not None:
            raise ValueError("field_map needs a sample_type")
        return None
    if sample_type != CRUDE and sample_type not in SAMPLE_TYPES:
        raise ValueError(f"unknown sample_type {sample_type!r}; known: {sorted(SAMPLE_TYPES) + [CRUDE]}")
    if field_map is None:
        return None
    if sample_type == CRUDE:
        raise ValueError("CrudeWebdataset takes no field_map: its raw parts go to a Cooker")
    if not isinstance(field_map, Mapping) or not all(isinstance(v, str) and v for v in field_map.values()):
        raise ValueError(f"field_map must map field names to part names (non-empty strings), got {field_map!r}")
    return _check_field_map(dict(field_map), SAMPLE_TYPES[sample_type], f"field_map for {sample_type}")


_LOADER_TEMPLATE = '''"""Sample loader generated by `energon-ray prepare`: fill in the TODOs.

``raw`` maps each tar part of one sample ({names}) to its decoded value, plus ``__key__``.
The returned dict holds the fields of {cls}; optional fields are commented out.
"""


def sample_loader(raw: dict) -> dict:
    return dict(
{fields}
    )


def part_filter(part: str) -> bool:
    """Only the parts accepted here are read and decoded; drop the ones the loader does not use."""
    return part in {parts}
'''


def _sample_loader_template(cls: type, part_types: Sequence[str]) -> str:
    lines = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("__"):
            continue
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", repr(field.type))
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        lines.append(f'        {"" if required else "# "}{field.name}=raw["TODO"],  # {kind}')
    names = ", ".join(part_types) or "no parts found"
    return _LOADER_TEMPLATE.format(cls=cls.__name__, fields="\n".join(lines), names=names, parts=tuple(part_types))


def write_dataset_config(
    path: Path | str,
    sample_type: str,
    field_map: Optional[Mapping[str, str]] = None,
    part_types: Sequence[str] = (),
    dataset_config: str = "dataset.yaml",
) -> Tuple[Path, Optional[Path]]:
    """Write ``dataset.yaml`` (module ``megatron.energon``, so both libraries load it).

    A non-crude type without ``field_map`` gets a ``sample_loader.py`` template (an existing one is
    kept) that the YAML references as ``sample_loader`` and ``part_filter``.

    Returns:
        ``(dataset.yaml path, sample_loader.py path or None)``.

    Raises:
        ValueError: see :func:`check_sample_config`; also when ``sample_type`` is None.
        DatasetConfigError: a file to write leads outside the dataset folder (see :func:`check_write_target`).
    """
    if sample_type is None:
        raise ValueError("write_dataset_config needs a sample_type")
    check_sample_config(sample_type, field_map)
    meta = check_write_target(path, meta_dir(path))
    check_write_target(path, meta / dataset_config)
    if sample_type == CRUDE or field_map is not None:
        fields = dict(field_map) if field_map is not None else None
        return write_dataset_yaml(path, sample_type, field_map=fields, dataset_config=dataset_config), None
    loader = check_write_target(path, meta / SAMPLE_LOADER_FILE)
    if not loader.exists():
        write_file(path, loader, _sample_loader_template(SAMPLE_TYPES[sample_type], part_types).encode())
    out = write_dataset_yaml(
        path, sample_type, sample_loader=f"{SAMPLE_LOADER_FILE}:sample_loader",
        part_filter=f"{SAMPLE_LOADER_FILE}:part_filter", dataset_config=dataset_config,
    )  # fmt: skip
    return out, loader


def _warnings(
    splits: Dict[str, List[str]], names: List[str], parsed_map: Optional[Dict], part_types: Tuple[str, ...]
) -> List[str]:
    used = {n for shards in splits.values() for n in shards}
    out = [f"split part {p!r} has no shards" for p, shards in splits.items() if not shards]
    unused = [n for n in names if n not in used]
    if unused:
        out.append(f"{len(unused)} shard(s) are in no split part, e.g. {unused[0]}")
    for field, options in (parsed_map or {}).items():
        if not any(opt[0] in part_types for opt in options):
            used_parts = [o[0] for o in options]
            out.append(f"field_map[{field!r}] uses part(s) {used_parts}; the shards have {list(part_types)}")
    return out


def unreadable_media(unreadable: List[str]) -> List[str]:
    """A warning for the media files whose metadata could not be read (none when all could)."""
    if not unreadable:
        return []
    return [f"{len(unreadable)} media file(s) could not be read and have no metadata row, e.g. {unreadable[0]}"]


def _check_config_name(name: str, taken: List[str]) -> None:
    """The dataset config's name: a ``.yaml`` file of its own in ``.nv-meta`` (not one that prepare
    writes besides it, which it would overwrite, nor one in a sub-folder)."""
    if not isinstance(name, str) or not name.endswith((".yaml", ".yml")):
        raise ValueError(f"the dataset config name must be a .yaml file name, got {name!r}")
    if name in taken:
        raise ValueError(f"the dataset config name {name!r} is a file prepare writes itself; choose another (e.g. dataset.yaml)")
    if "/" in name.replace("\\", "/"):
        raise ValueError(f"the dataset config name must be a file name in .nv-meta, not a path: {name!r}")


def _check_meta_targets(root: Path, dataset_config: Optional[str]) -> None:
    """Refuse before anything is written when a ``.nv-meta`` file that prepare writes leads outside ``root``."""
    names = [INFO_JSON, INFO_YAML, INDEX_SQLITE, INDEX_SQLITE + ".tmp", INDEX_UUID, SPLIT_FILE]
    if dataset_config is not None:
        _check_config_name(dataset_config, names + [SAMPLE_LOADER_FILE, "split.json"])
        names += [dataset_config, SAMPLE_LOADER_FILE]
    meta = check_write_target(root, meta_dir(root))
    for name in names:
        check_write_target(root, meta / name)


def _reindex(
    root: Path, num_workers: int, progress: bool, conflicts: Dict[str, object], shard_indexer: Optional[ShardIndexer]
) -> PrepareResult:
    given = sorted(name for name, value in conflicts.items() if value)
    if given:
        raise ValueError(
            f"tar_index_only only rebuilds the indexes of the shards listed in .nv-meta/.info.json; drop {given}"
        )
    old = read_info(root)
    counts, part_types = index_dataset(
        root, list(old), num_workers=num_workers, progress=progress, shard_indexer=shard_indexer
    )
    warnings = []
    if counts != old:
        write_info(root, counts, energon_version_string())
        changed = [n for n in counts if counts[n] != old[n]]
        warnings.append(f"sample counts changed for {changed}; updated .nv-meta/{INFO_JSON}")
    return PrepareResult(root, shard_counts=counts, split_parts={}, part_types=part_types, warnings=tuple(warnings))


def prepare_dataset(
    path: Path | str,
    *,
    split_ratio: Optional[Sequence[float]] = None,
    split_parts: Optional[Mapping[str, Sequence[str]]] = None,
    exclude: Sequence[str] = (),
    shuffle_tars: bool = False,
    sample_type: Optional[str] = None,
    field_map: Optional[Mapping[str, str]] = None,
    tar_index_only: bool = False,
    force_overwrite: bool = False,
    progress: bool = True,
    num_workers: int = 1,
    dataset_config: str = "dataset.yaml",
    shard_indexer: Optional[ShardIndexer] = None,
    media_filter: Optional[MediaFilter] = None,
) -> PrepareResult:
    """Index the tar shards under ``path`` and write ``.nv-meta`` (Energon's ``energon prepare``).

    Args:
        path: dataset folder or ``s3://``/``msc://`` URL; ``**/*.tar`` and ``**/*.tgz`` below it are the
            shards (sorted). A remote dataset's shards are read with ranged requests and every file
            is written back to the store.
        split_ratio: train/val/test weights, e.g. ``(8, 1, 1)``; splits are whole shards.
        split_parts: instead of a ratio, ``{part: [regex, ...]}`` (brace-expanded, ``re.match``).
        exclude: regexes (``re.search``) of shard paths to leave out.
        shuffle_tars: shuffle shards with ``random.Random(42)`` before the ratio split.
        sample_type: a sample class name or ``"CrudeWebdataset"``; None writes no dataset.yaml.
        field_map: ``{field: part}``; without it a ``sample_loader.py`` template is written.
        tar_index_only: only rebuild ``.tar.idx``/``index.sqlite`` of the listed shards.
        force_overwrite: allow re-preparing a dataset that has ``.nv-meta/.info.json``.
        progress: show a progress bar.
        num_workers: processes indexing shards in parallel.
        dataset_config: file name of the dataset config inside ``.nv-meta``.
        shard_indexer: runs :func:`index_shard` over the shards instead of the local process pool
            (e.g. as Ray tasks: ``jobs/prepare_job.py``); everything else, and every file, stays the same.
        media_filter: also store the metadata of the media members (image size/format, audio/video
            stream facts) in ``index.sqlite`` (Energon's ``--media-metadata-by-…``; see
            :mod:`energon_ray.format.media_index`).

    Returns:
        A :class:`PrepareResult` (counts, splits, part types, files, warnings).

    Raises:
        ValueError: invalid arguments (named). DatasetConfigError: already prepared, no shards,
            bad tar, a duplicate sample key (naming both shards), or a file to write that is a
            symlink or leads outside the dataset folder (nothing is written through it).

    Example:
        >>> from energon_ray.synthetic import write_captioning_dataset
        >>> import tempfile; root = tempfile.mkdtemp()
        >>> _ = write_captioning_dataset(root, 8, 3, image_size=(8, 8))
        >>> r = prepare_dataset(root, split_ratio=[8, 1, 1], sample_type="CaptioningSample",
        ...                     field_map={"image": "jpg", "caption": "txt"}, progress=False)
        >>> r.total_samples, r.split_parts["test"]
        (8, ['shards/shard_0002.tar'])
    """
    root = as_path(path)
    if not root.is_dir():
        raise DatasetConfigError(f"{root}: dataset folder does not exist")
    if not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    exclude = [exclude] if isinstance(exclude, str) else list(exclude or ())
    if tar_index_only and media_filter is not None:
        raise ValueError("media_filter cannot be combined with tar_index_only (as in Energon)")
    if tar_index_only:
        conflicts = dict(split_ratio=split_ratio, split_parts=split_parts, exclude=exclude,
                         shuffle_tars=shuffle_tars, sample_type=sample_type, field_map=field_map)  # fmt: skip
        return _reindex(root, num_workers, progress, conflicts, shard_indexer)
    if (split_ratio is None) == (split_parts is None):
        raise ValueError("give exactly one of split_ratio (e.g. [8, 1, 1]) or split_parts ({'train': [regex]})")
    ratio = check_ratio(split_ratio) if split_ratio is not None else None
    patterns = _check_split_parts(split_parts) if split_parts is not None else None
    if shuffle_tars and ratio is None:
        raise ValueError("shuffle_tars only applies to split_ratio, not to split_parts")
    parsed_map = check_sample_config(sample_type, field_map)
    existing = already_prepared(root)
    if existing is not None and not force_overwrite:
        raise DatasetConfigError(f"{existing}: the dataset is already prepared; pass force_overwrite=True to redo it")
    _check_meta_targets(root, dataset_config if sample_type is not None else None)
    names = find_shards(root, exclude)
    linked = [
        f"{folder}/ is a link to a folder, which prepare does not follow: its {count} shard(s) are not part of the "
        "dataset (link the shard files, or move the folder in)"
        for folder, count in linked_shard_folders(root)
    ]
    if not names:
        excluded = f" after excluding {exclude}" if exclude else ""
        raise DatasetConfigError(f"{root}: no .tar/.tgz shards found{excluded}" + "".join(f"; {w}" for w in linked))
    counts, part_types = index_dataset(
        root, names, num_workers=num_workers, progress=progress, shard_indexer=shard_indexer
    )
    media_rows, unreadable = None, []
    if media_filter is not None:
        media_rows = write_media_metadata(root, media_filter, shards=names, progress=progress, skipped=unreadable)
    write_info(root, counts, energon_version_string())
    splits = split_by_ratio(names, ratio, shuffle_tars) if ratio else split_by_patterns(names, patterns or {})
    write_split_file(root, {part: collapse_names(shards) for part, shards in splits.items()}, split_config=SPLIT_FILE)
    warnings = linked + _warnings(splits, names, parsed_map, part_types) + unreadable_media(unreadable)
    yaml_path = loader = None
    if sample_type is not None:
        yaml_path, loader = write_dataset_config(root, sample_type, field_map, part_types, dataset_config)
        if loader is not None:
            warnings.append(f"{loader}: edit this sample loader so it returns the fields of {sample_type}")
    return PrepareResult(
        root=root, shard_counts=counts, split_parts=splits, part_types=part_types,
        dataset_config=yaml_path, sample_loader=loader, warnings=tuple(warnings), media_metadata=media_rows,
    )  # fmt: skip
