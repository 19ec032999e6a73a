"""``.nv-meta/dataset.yaml``: how tar parts become a typed sample.

Either ``sample_type`` + ``field_map``, or ``sample_type`` + ``sample_loader: file.py:fn`` +
``part_filter``, or a top-level ``__class__`` (``CrudeWebdataset``, legacy ``CaptioningWebdataset``…).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import yaml

from energon_ray.errors import DatasetConfigError, first_time, parse_problem, users_stacklevel
from energon_ray.format import energon_yaml
from energon_ray.format.dataset_code import RemoteFiles, load_callable, named_sample_type
from energon_ray.format.field_access import parse_field_access
from energon_ray.format.info import check_write_target, meta_dir, write_file
from energon_ray.storage import RemotePath, as_path, is_remote
from energon_ray.samples import CrudeSample

logger = logging.getLogger("energon_ray")

#: The top-level keys Energon's dataset.yaml knows: the dataset class and the arguments of Energon's
#: dataset factories (``StandardWebdatasetFactory`` and its bases); energon_ray reads the first seven.
DATASET_YAML_KEYS = (
    "sample_type", "field_map", "sample_loader", "part_filter", "subflavors", "__module__", "__class__",
    "decoder", "shuffle_over_epochs", "parallel_shard_iters", "max_samples_per_sequence", "subset",
    "split_part", "split_config", "training", "worker_config", "path",
)  # fmt: skip
#: ``errors.first_time`` kind of a dataset config file's deprecated ``__class__`` (keyed by file)
LEGACY_CLASS = "legacy dataset.yaml __class__"


@dataclasses.dataclass
class DatasetSpec:
    """What ``dataset.yaml`` says about turning raw parts into samples."""

    file: str
    #: Dataset root and config file name: a spec is shipped to Ray workers as these two and re-read
    #: there, because user ``sample_loader.py`` modules are not importable by name in other processes.
    root: str
    dataset_config: str
    #: A ``Sample`` subclass, or ``CrudeSample`` for crude datasets.
    sample_type: type
    #: ``{field: [[part, key, ...], ...alternatives]}`` when a field_map is used.
    field_map: Optional[Dict[str, List[List[str]]]] = None
    #: ``fn(raw_sample: dict) -> dict of fields`` when a sample_loader is used.
    sample_loader: Optional[Callable[[dict], dict]] = None
    #: ``fn(part: str) -> bool``: which tar parts to read at all (None = all).
    part_filter: Optional[Callable[[str], bool]] = None
    #: The parts a field_map needs (used as the part filter).
    parts: Optional[frozenset] = None
    subflavors: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Everything else the YAML passes on (kept for ``config()``).
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Whether the user allowed this dataset's code (``sample_loader.py``, classes outside energon_ray).
    trusted: bool = False
    #: A remote dataset's root (with the settings that reach it) and the bytes of the config files
    #: read from it: Ray workers rebuild the spec from these, without a request to the store.
    location: Optional[RemotePath] = dataclasses.field(default=None, repr=False, compare=False)
    files: Optional[Dict[str, Optional[bytes]]] = dataclasses.field(default=None, repr=False, compare=False)
    #: The deprecated typed factory a top-level ``__class__`` names (``CaptioningWebdataset``), else None.
    legacy_class: Optional[str] = dataclasses.field(default=None, repr=False, compare=False)

    def __reduce__(self):
        if self.dataset_config == "<jsonl>":
            from energon_ray.format.jsonl import jsonl_spec

            return (jsonl_spec, (self.root,))
        if self.location is not None:
            return (_remote_spec, (self.location, self.dataset_config, self.trusted, self.files))
        return (read_dataset_spec, (self.root, self.dataset_config, self.trusted))

    @property
    def is_crude(self) -> bool:
        return self.sample_type is CrudeSample

    def wants_part(self, part: str) -> bool:
        """Whether a tar part is read for this dataset."""
        if self.parts is not None:
            return part in self.parts
        if self.part_filter is not None:
            return bool(self.part_filter(part))
        return True


def warn_unknown_keys(spec: DatasetSpec) -> None:
    """Log a warning naming each top-level key of ``spec``'s file that Energon does not know (a typo such
    as ``subflavours``: read by nothing) with a close match, once per file and process. A warning, not an
    error: a newer Energon may add keys. Called where the driver opens a dataset, not where a Ray
    worker rebuilds the spec."""
    unknown = [key for key in spec.extra if key not in DATASET_YAML_KEYS]
    if not unknown or not first_time("unknown dataset.yaml keys", spec.file):
        return
    for key in unknown:
        close = difflib.get_close_matches(str(key), DATASET_YAML_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        logger.warning("%s: unknown key %r%s; it is ignored", spec.file, key, hint)


def _check_field_map(field_map: Dict[str, str], sample_type: type, file: str) -> Dict[str, List[List[str]]]:
    if not isinstance(field_map, dict) or not field_map:
        raise DatasetConfigError(f"{file}: field_map must be a non-empty mapping, got {field_map!r}")
    fields = {f.name: f for f in dataclasses.fields(sample_type)}
    for name in field_map:
        if name not in fields or name.startswith("__"):
            valid = [n for n in fields if not n.startswith("__")]
            raise DatasetConfigError(
                f"{file}: field_map names field {name!r}, which {sample_type.__name__} does not have; "
                f"its fields are {valid}"
            )
    missing = [
        n for n, f in fields.items()
        if not n.startswith("__") and n not in field_map
        and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]  # fmt: skip
    if missing:
        raise DatasetConfigError(
            f"{file}: field_map does not map required field(s) {missing} of {sample_type.__name__}"
        )
    parsed = {}
    for name, spec in field_map.items():
        if not isinstance(spec, str):
            raise DatasetConfigError(
                f"{file}: field_map[{name!r}] must be a part name (or access path) as a string, got "
                f"{type(spec).__name__} {spec!r}" + ("; alternatives are written 'jpg,png'" if isinstance(spec, list) else "")
            )
        try:
            parsed[name] = parse_field_access(str(spec))
        except ValueError as exc:
            raise DatasetConfigError(f"{file}: field_map[{name!r}]: {exc}") from None
    return parsed


def _remote_spec(location: RemotePath, dataset_config: str, trusted: bool, files: Optional[Dict]) -> DatasetSpec:
    """A remote dataset's spec rebuilt (on a Ray worker) from the config files it was read from."""
    return read_dataset_spec(location, dataset_config, trusted, files=RemoteFiles(files))


def warn_legacy_class(spec: DatasetSpec) -> None:
    """Energon's deprecation of a top-level ``__class__: CaptioningWebdataset`` (any typed
    ``<Name>Webdataset``): a ``FutureWarning`` (Energon's category) naming the file and the
    ``sample_type:`` to write instead, once per file and process. Called where the driver opens a
    dataset, not where a Ray worker rebuilds the spec (workers stay quiet)."""
    if spec.legacy_class is None or not first_time(LEGACY_CLASS, spec.file):
        return
    warnings.warn(
        f"{spec.file}: __class__: {spec.legacy_class} is deprecated (as in megatron-energon): drop the "
        f"top-level __module__/__class__ and write `sample_type: {{__module__: megatron.energon, __class__: "
        f"{spec.sample_type.__name__}}}` instead, keeping the rest",
        FutureWarning,
        stacklevel=users_stacklevel(),  # the user's call, whatever energon_ray calls lie between
    )


def _legacy_class(data: Dict[str, Any]) -> Optional[str]:
    """The typed factory (``CaptioningWebdataset``…) a config's ``__class__`` names, if Energon's."""
    name, module = data.get("__class__"), data.get("__module__")
    if not isinstance(name, str) or not name.endswith("Webdataset") or name == "CrudeWebdataset":
        return None
    if module is not None and not str(module).startswith(("megatron.energon", "energon_ray")):
        return None  # a factory of the user's own
    return name


def read_dataset_spec(
    path: Path | str | RemotePath, dataset_config: str = "dataset.yaml", trusted: bool = False,
    files: Optional[RemoteFiles] = None,
) -> DatasetSpec:  # fmt: skip
    """Parse and validate ``dataset.yaml``; code it names (``sample_loader``, ``part_filter`` functions,
    classes outside energon_ray) is loaded only when ``trusted``.

    ``files``: config files of a remote dataset already read (the spec keeps what it read, so a Ray
    worker rebuilds it without a request).

    Raises:
        DatasetConfigError: naming the file and the offending value.
        UntrustedCodeError: the file names code and ``trusted`` is False.
    """
    meta = meta_dir(path)
    file = meta / dataset_config
    remote = is_remote(path)
    if remote:
        files = files or RemoteFiles()
    data = _read_yaml(file, files if remote else None)
    fname = str(file)
    subflavors = data.pop("subflavors", None) or {}
    if not isinstance(subflavors, dict):
        raise DatasetConfigError(f"{fname}: subflavors must be a mapping of names to values, got {type(subflavors).__name__} {subflavors!r}")
    legacy_class = _legacy_class(data)
    sample_type = named_sample_type(data, fname, trusted)
    field_map = data.pop("field_map", None)
    loader_ref = data.pop("sample_loader", None)
    part_filter_ref = data.pop("part_filter", None)
    spec = DatasetSpec(
        file=fname,
        # absolute: the spec is read again in Ray workers, whose current directory is not the caller's
        root=str(path) if remote else os.path.abspath(path),
        dataset_config=dataset_config,
        sample_type=sample_type,
        subflavors=dict(subflavors),
        extra=data,
        trusted=trusted,
        location=as_path(path) if remote else None,
        files=files.files if files is not None else None,
        legacy_class=legacy_class,
    )
    _set_parts(spec, meta, field_map, loader_ref, part_filter_ref, files)
    return spec


def _read_yaml(file: Any, files: Optional[RemoteFiles]) -> Dict[str, Any]:
    """The YAML mapping in ``file`` (read through ``files`` for a remote dataset)."""
    text = None
    if files is not None:
        raw = files.read(file)
        if raw is None:
            raise DatasetConfigError(f"{file}: dataset config not found")
        text = raw.decode("utf-8", "replace")
    elif not file.is_file():
        raise DatasetConfigError(f"{file}: dataset config not found")
    try:
        data = energon_yaml.load(text if text is not None else file.read_text()) or {}
    except Exception as exc:
        raise DatasetConfigError(f"{file}: cannot parse: {parse_problem(exc)}") from None
    if not isinstance(data, dict):
        raise DatasetConfigError(f"{file}: expected a mapping of keys (sample_type, field_map, ...), got a {type(data).__name__}")
    return dict(data)


def _set_parts(spec: DatasetSpec, meta: Any, field_map: Any, loader_ref: Any, part_filter_ref: Any, files: Optional[RemoteFiles]) -> None:
    """How ``spec``'s samples are made from their parts: a ``field_map``, or a ``sample_loader`` with
    a ``part_filter`` (a list of parts, or a function: code, loaded only when the spec is trusted);
    a crude dataset takes an optional ``part_filter`` only."""
    fname, trusted = spec.file, spec.trusted
    if spec.sample_type is CrudeSample:
        if isinstance(part_filter_ref, list):
            spec.parts = frozenset(part_filter_ref)
        elif part_filter_ref is not None:
            spec.part_filter = load_callable(part_filter_ref, meta, fname, "part_filter", trusted, files)
        return
    if (field_map is None) == (loader_ref is None):
        raise DatasetConfigError(f"{fname}: give exactly one of 'field_map' or 'sample_loader'")
    if field_map is not None:
        if part_filter_ref is not None:
            raise DatasetConfigError(f"{fname}: 'part_filter' cannot be combined with 'field_map'")
        spec.field_map = _check_field_map(field_map, spec.sample_type, fname)
        spec.parts = frozenset(opt[0] for opts in spec.field_map.values() for opt in opts)
        return
    if part_filter_ref is None:
        raise DatasetConfigError(f"{fname}: 'sample_loader' needs a 'part_filter'")
    spec.sample_loader = load_callable(loader_ref, meta, fname, "sample_loader", trusted, files)
    if isinstance(part_filter_ref, list):
        spec.parts = frozenset(part_filter_ref)
    else:
        spec.part_filter = load_callable(part_filter_ref, meta, fname, "part_filter", trusted, files)


def write_dataset_yaml(
    path: Path | str,
    sample_type: str,
    field_map: Optional[Dict[str, str]] = None,
    sample_loader: Optional[str] = None,
    part_filter: Optional[Any] = None,
    dataset_config: str = "dataset.yaml",
    module: str = "megatron.energon",
) -> Path:
    """Write a ``dataset.yaml`` that both energon_ray and megatron-energon read (never through a
    symlink out of the dataset folder)."""
    meta = check_write_target(path, meta_dir(path))
    meta.mkdir(parents=True, exist_ok=True)
    if sample_type == "CrudeWebdataset":
        data: Dict[str, Any] = {"__module__": module, "__class__": "CrudeWebdataset"}
    else:
        data = {"sample_type": {"__module__": module, "__class__": sample_type}}
    if field_map is not None:
        data["field_map"] = dict(field_map)
    if sample_loader is not None:
        data["sample_loader"] = sample_loader
    if part_filter is not None:
        data["part_filter"] = part_filter
    return write_file(path, meta / dataset_config, yaml.safe_dump(data, sort_keys=False).encode())


def _first_sample_parts(shard: str, offset: int) -> tuple:
    """``(key, parts)`` of the sample whose first header is at ``offset``: headers only, no payloads."""
    import tarfile

    from energon_ray.format.tar_reader import SKIP_META_RE, split_member_name

    key, parts = None, set()
    with (as_path(shard).open("rb") if is_remote(shard) else open(shard, "rb")) as f:
        f.seek(offset)
        with tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                split = split_member_name(member.name)
                if not member.isfile() or SKIP_META_RE.match(member.name) or split is None:
                    continue
                if key is not None and split[0] != key:
                    break
                key = split[0]
                parts.add(split[1])
    return key, parts


def check_field_map_parts(spec: DatasetSpec, samples: List[tuple]) -> None:
    """Fail before any Ray task when the field_map names a part that none of the given samples has
    (e.g. ``png`` for a dataset of ``jpg``): otherwise every sample would be skipped as bad.

    Args:
        samples: ``(shard path, byte offset of a sample's first header)`` of a few samples to look at.

    Raises:
        DatasetConfigError: naming the field, the part(s), a sample key, its shard and the parts it has.
    """
    if spec.field_map is None:
        return
    seen = []
    for shard, offset in samples:
        try:
            key, parts = _first_sample_parts(shard, offset)
        except Exception:  # an unreadable shard is reported, with its sample, when it is read
            continue
        if key is not None:
            seen.append((shard, key, parts))
    for field, options in spec.field_map.items():
        if seen and not any(option[0] in parts for _, _, parts in seen for option in options):
            shard, key, parts = seen[0]
            wanted = ",".join(option[0] for option in options)
            raise DatasetConfigError(
                f"{spec.file}: field_map field {field!r} reads part {wanted!r}, but sample {key!r} of {shard} "
                f"has no such part (its parts: {sorted(parts)}; {len(seen)} sample(s) checked); fix the "
                "field_map or the dataset"
            )
