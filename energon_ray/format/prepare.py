"""Index tar shards and write ``.nv-meta`` (``energon-ray prepare``), in Energon's on-disk format.

Per shard: ``<shard>.tar.idx``. Per dataset: ``.nv-meta/.info.json``, ``split.yaml``,
``dataset.yaml``, ``index.sqlite`` (key → byte range, for random access by key) and ``index.uuid``.
Both energon_ray and megatron-energon load the result.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.metadata
import math
import os
import random
import re
import sqlite3
import tarfile
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import braceexpand
from tqdm import tqdm

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset_yaml import _check_field_map, write_dataset_yaml
from energon_ray.format.info import INFO_JSON, INFO_YAML, meta_dir, read_info, write_info
from energon_ray.format.split import write_split_file
from energon_ray.format.tar_index import write_tar_index
from energon_ray.format.tar_reader import SKIP_META_RE, split_member_name
from energon_ray.samples import SAMPLE_TYPES

#: The megatron-energon release whose on-disk format this module writes.
ENERGON_FORMAT_VERSION = "7.4.1"
INDEX_SQLITE = "index.sqlite"
INDEX_UUID = "index.uuid"
SAMPLE_LOADER_FILE = "sample_loader.py"
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
class ShardIndex:
    """What indexing one tar found: sample offsets (plus the end), keys and part locations."""

    name: str
    offsets: Tuple[int, ...]
    keys: Tuple[str, ...]
    #: ``(sample_index, part_name, content_byte_offset, content_byte_size)`` per member.
    parts: Tuple[Tuple[int, str, int, int], ...]

    @property
    def count(self) -> int:
        return len(self.keys)


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


def find_shards(path: Path | str, exclude: Sequence[str] = ()) -> List[str]:
    """``**/*.tar`` and ``**/*.tgz`` under ``path`` (not hidden) as sorted relative names, minus ``exclude``.

    Raises:
        ValueError: if an exclude pattern is not a valid regex.
    """
    root = Path(path)
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


def _check_tar_end(file, path: Path, end: int) -> None:
    # tarfile silently stops at a corrupt header, which would hide the rest of the shard.
    size = os.fstat(file.fileno()).st_size
    if end > size:
        raise DatasetConfigError(f"{path}: truncated tar: the last member ends at byte {end}, the file has {size}")
    file.seek(end)
    block = file.read(_BLOCK)
    if block.strip(b"\0") and len(block) < _BLOCK:
        raise DatasetConfigError(f"{path}: truncated tar: the file ends inside the header at byte {end}")
    if block.strip(b"\0"):
        raise DatasetConfigError(f"{path}: invalid tar header at byte {end}; the shard is corrupt after that point")


def index_shard(root: Path | str, name: str) -> ShardIndex:
    """Index one tar shard and write its ``.tar.idx``.

    Args:
        root: the dataset folder.
        name: the shard's path relative to ``root``.

    Returns:
        The shard's offsets, keys and part locations.

    Raises:
        DatasetConfigError: unreadable, compressed, corrupt or empty tar, or a key split across runs.
    """
    path = Path(root) / name
    offsets: List[int] = []
    keys: List[str] = []
    parts: List[Tuple[int, str, int, int]] = []
    first_seen: Dict[str, int] = {}
    with open(path, "rb") as file:
        if file.read(2) == b"\x1f\x8b":
            raise DatasetConfigError(
                f"{path}: gzip-compressed shard; samples cannot be read by byte offset, decompress it to .tar"
            )
        file.seek(0)
        try:
            with tarfile.open(fileobj=file, mode="r:") as tar:
                for member in tar:
                    split = split_member_name(member.name)
                    if not member.isreg() or SKIP_META_RE.match(member.name) or split is None:
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
                    parts.append((len(keys) - 1, part, member.offset_data, member.size))
                end = tar.offset
        except tarfile.TarError as exc:
            raise DatasetConfigError(f"{path}: not a readable tar file: {exc}") from None
        _check_tar_end(file, path, end)
    if not keys:
        raise DatasetConfigError(f"{path}: shard holds no samples; remove it or drop it with --exclude")
    offsets.append(end)
    write_tar_index(path, offsets)
    if path.suffix == ".tgz" and not path.with_suffix(".tar").exists():
        write_tar_index(path.with_suffix(".tar"), offsets)  # megatron-energon names it x.tar.idx
    return ShardIndex(name=name, offsets=tuple(offsets), keys=tuple(keys), parts=tuple(parts))


def _index_shards(root: Path, names: List[str], num_workers: int, progress: bool) -> Iterator[ShardIndex]:
    workers = min(num_workers, len(names))
    bar = tqdm(total=len(names), desc="Indexing shards", unit="shard", disable=not progress)
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
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


def _finish_index_db(db: sqlite3.Connection, tmp: Path, final: Path) -> None:
    db.execute("CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)")
    db.execute("CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)")
    db.execute(
        "CREATE INDEX idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
        "content_byte_offset, content_byte_size)"
    )
    db.execute("COMMIT")
    db.close()
    os.replace(tmp, final)
    (final.parent / INDEX_UUID).write_text(str(uuid.uuid4()))


def index_dataset(
    root: Path, names: List[str], *, num_workers: int = 1, progress: bool = True
) -> Tuple[Dict[str, int], Tuple[str, ...]]:
    """Index every shard (``.tar.idx``) and write ``.nv-meta/index.sqlite`` and ``index.uuid``.

    Returns:
        ``({shard name: sample count} in ``names`` order, sorted part names)``.

    Raises:
        DatasetConfigError: a bad shard, or a sample key found in two places (both named).
    """
    meta = meta_dir(root)
    meta.mkdir(parents=True, exist_ok=True)
    tmp = meta / (INDEX_SQLITE + ".tmp")
    db = _create_index_db(tmp)
    counts: Dict[str, int] = {}
    part_types: set = set()
    try:
        for shard_id, shard in enumerate(_index_shards(root, names, num_workers, progress)):
            _insert_shard(db, shard_id, shard, names)
            counts[shard.name] = shard.count
            if len(part_types) < 1000:
                part_types.update(p[1] for p in shard.parts)
        _finish_index_db(db, tmp, meta / INDEX_SQLITE)
    except BaseException:
        db.close()
        tmp.unlink(missing_ok=True)
        raise
    return counts, tuple(sorted(part_types))


def split_by_ratio(names: Sequence[str], ratio: Sequence[float], shuffle: bool = False) -> Dict[str, List[str]]:
    """Whole shards to train/val/test: cut points ``int(n * cumulative normalised ratio)``.

    As in Energon, except that the last part always ends at ``n``: Energon's float sum can end
    just below 1 (e.g. ratio ``0.1,0.2,0.3``) and then silently drops the last shard.

    Example:
        >>> split_by_ratio(["a.tar", "b.tar", "c.tar"], [8, 1, 1])
        {'train': ['a.tar', 'b.tar'], 'val': [], 'test': ['c.tar']}
    """
    order = list(names)
    if shuffle:
        random.Random(42).shuffle(order)
    total = float(sum(ratio))
    out, start, cumulative = {}, 0, 0.0
    for part, value in zip(RATIO_PARTS, ratio):
        cumulative += value / total
        end = len(order) if part == RATIO_PARTS[-1] else int(len(order) * cumulative)
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


def _check_ratio(split_ratio: Sequence[float]) -> Tuple[float, ...]:
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
    """
    if sample_type is None:
        raise ValueError("write_dataset_config needs a sample_type")
    check_sample_config(sample_type, field_map)
    if sample_type == CRUDE or field_map is not None:
        fields = dict(field_map) if field_map is not None else None
        return write_dataset_yaml(path, sample_type, field_map=fields, dataset_config=dataset_config), None
    loader = meta_dir(path) / SAMPLE_LOADER_FILE
    if not loader.exists():
        loader.write_text(_sample_loader_template(SAMPLE_TYPES[sample_type], part_types))
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


def _reindex(root: Path, num_workers: int, progress: bool, conflicts: Dict[str, object]) -> PrepareResult:
    given = sorted(name for name, value in conflicts.items() if value)
    if given:
        raise ValueError(
            f"tar_index_only only rebuilds the indexes of the shards listed in .nv-meta/.info.json; drop {given}"
        )
    old = read_info(root)
    counts, part_types = index_dataset(root, list(old), num_workers=num_workers, progress=progress)
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
) -> PrepareResult:
    """Index the tar shards under ``path`` and write ``.nv-meta`` (Energon's ``energon prepare``).

    Args:
        path: dataset folder; ``**/*.tar`` and ``**/*.tgz`` below it are the shards (sorted).
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

    Returns:
        A :class:`PrepareResult` (counts, splits, part types, files, warnings).

    Raises:
        ValueError: invalid arguments (named). DatasetConfigError: already prepared, no shards,
            bad tar, or a duplicate sample key (naming both shards).

    Example:
        >>> from energon_ray.synthetic import write_captioning_dataset
        >>> import tempfile; root = tempfile.mkdtemp()
        >>> _ = write_captioning_dataset(root, 8, 3, image_size=(8, 8))
        >>> r = prepare_dataset(root, split_ratio=[8, 1, 1], sample_type="CaptioningSample",
        ...                     field_map={"image": "jpg", "caption": "txt"}, progress=False)
        >>> r.total_samples, r.split_parts["test"]
        (8, ['shards/shard_0002.tar'])
    """
    root = Path(path)
    if not root.is_dir():
        raise DatasetConfigError(f"{root}: dataset folder does not exist")
    if not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    exclude = [exclude] if isinstance(exclude, str) else list(exclude or ())
    if tar_index_only:
        conflicts = dict(split_ratio=split_ratio, split_parts=split_parts, exclude=exclude,
                         shuffle_tars=shuffle_tars, sample_type=sample_type, field_map=field_map)  # fmt: skip
        return _reindex(root, num_workers, progress, conflicts)
    if (split_ratio is None) == (split_parts is None):
        raise ValueError("give exactly one of split_ratio (e.g. [8, 1, 1]) or split_parts ({'train': [regex]})")
    ratio = _check_ratio(split_ratio) if split_ratio is not None else None
    patterns = _check_split_parts(split_parts) if split_parts is not None else None
    if shuffle_tars and ratio is None:
        raise ValueError("shuffle_tars only applies to split_ratio, not to split_parts")
    parsed_map = check_sample_config(sample_type, field_map)
    existing = already_prepared(root)
    if existing is not None and not force_overwrite:
        raise DatasetConfigError(f"{existing}: the dataset is already prepared; pass force_overwrite=True to redo it")
    names = find_shards(root, exclude)
    if not names:
        excluded = f" after excluding {exclude}" if exclude else ""
        raise DatasetConfigError(f"{root}: no .tar/.tgz shards found{excluded}")
    counts, part_types = index_dataset(root, names, num_workers=num_workers, progress=progress)
    write_info(root, counts, energon_version_string())
    splits = split_by_ratio(names, ratio, shuffle_tars) if ratio else split_by_patterns(names, patterns or {})
    write_split_file(root, {part: collapse_names(shards) for part, shards in splits.items()})
    warnings = _warnings(splits, names, parsed_map, part_types)
    yaml_path = loader = None
    if sample_type is not None:
        yaml_path, loader = write_dataset_config(root, sample_type, field_map, part_types, dataset_config)
        if loader is not None:
            warnings.append(f"{loader}: edit this sample loader so it returns the fields of {sample_type}")
    return PrepareResult(
        root=root, shard_counts=counts, split_parts=splits, part_types=part_types,
        dataset_config=yaml_path, sample_loader=loader, warnings=tuple(warnings),
    )  # fmt: skip
