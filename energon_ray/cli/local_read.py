"""Reading samples of a prepared dataset in this process, for ``energon-ray preview`` and ``lint``.

No Ray: samples are read with the loader's own pieces — :class:`ShardReader` over ``.tar.idx`` (the
read stage's raw dict), the dataset's :class:`SampleLoader` and a :class:`SampleDecoder` — so what
these commands show or flag is what a loader would yield or skip. Nothing the dataset brings
(``sample_loader.py``, ``part_filter``, classes outside energon_ray, pickled parts) runs unless trusted.
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import click

from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import DatasetConfigError, SampleException, UntrustedCodeError
from energon_ray.format.dataset import PreparedDataset, ShardInfo
from energon_ray.format.dataset_yaml import DatasetSpec, read_dataset_spec, warn_legacy_class, warn_unknown_keys
from energon_ray.format.info import read_info
from energon_ray.format.split import read_split_file
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import TAR_ENCODING, ShardReader, split_member_name
from energon_ray.pipeline.load import META_KEYS, SampleLoader
from energon_ray.samples import SourceInfo

#: ``--split-part all``: every shard of every split part.
ALL_PARTS = "all"
_PART_ORDER = ("train", "val", "test")
_BLOCK = 512


@dataclasses.dataclass(frozen=True)
class LocalShard:
    """A shard to read: its info, the index of its first sample in its split part, and its excluded samples."""

    info: ShardInfo
    start: int
    #: Indices (within the shard) that ``split.yaml`` excludes: the loader never reads them.
    excluded: FrozenSet[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class LocalDataset:
    """The shards of the split parts read (each shard once), in split-file order, and the dataset spec."""

    root: str
    split_part: str
    spec: DatasetSpec
    format: str
    shards: Tuple[LocalShard, ...]
    #: Split parts named but listing no shards (left out, as Energon's commands skip them).
    empty_parts: Tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Samples in the shards (excluded ones included)."""
        return sum(s.info.count for s in self.shards)

    @property
    def excluded(self) -> int:
        """Samples that ``split.yaml`` excludes."""
        return sum(len(s.excluded) for s in self.shards)

    def describe(self) -> str:
        kind = "crude" if self.spec.is_crude else self.spec.sample_type.__name__
        return f"{self.root} [{self.split_part}: {len(self.shards)} shards, {self.total} samples, {kind}]"


def with_cli_hint(exc: UntrustedCodeError) -> UntrustedCodeError:
    """The refusal with the command-line opt-in added."""
    return UntrustedCodeError(f"{exc}; on the command line pass --trust-dataset-code")


def split_parts_option(ctx: click.Context, param: click.Parameter, value: str) -> Tuple[str, ...]:
    """Click callback of ``--split-part``/``--split-parts``: :func:`split_part_list`, a usage error if bad."""
    try:
        return split_part_list(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def config_file_options(command: Callable) -> Callable:
    """``--split-config`` and ``--dataset-config`` (Energon's names and defaults) of ``lint`` and ``preview``."""
    command = click.option("--dataset-config", default="dataset.yaml", show_default=True,
                           help="Dataset config file in .nv-meta (or a path), as Energon's.")(command)  # fmt: skip
    return click.option("--split-config", default="split.yaml", show_default=True,
                        help="Split config file in .nv-meta (or a path), as Energon's.")(command)  # fmt: skip


def check_path_options(path: Path, split_config: str, dataset_config: str) -> None:
    """Usage errors for a PATH the command cannot read and for config files a ``.jsonl`` file does not have."""
    if path.is_file() and path.suffix != ".jsonl":
        raise click.UsageError(f"{path}: PATH must be a prepared dataset folder or a .jsonl file")
    options = (("--split-config", split_config, "split.yaml"), ("--dataset-config", dataset_config, "dataset.yaml"))
    given = " and ".join(name for name, value, default in options if value != default)
    if path.suffix == ".jsonl" and given:
        raise click.UsageError(f"{path}: a .jsonl file has no .nv-meta config files; {given} cannot apply")


def split_part_list(value: str) -> Tuple[str, ...]:
    """The split parts a ``--split-part``/``--split-parts`` value names: one, a comma list (Energon's
    ``--split-parts train,val,test``; repeats dropped) or ``all``.

    Raises:
        ValueError: an empty name, or ``all`` beside other parts.

    Example:
        >>> split_part_list("train, val,train")
        ('train', 'val')
    """
    names = [name.strip() for name in value.split(",")]
    if "" in names:
        raise ValueError(f"expected split part names separated by commas, got {value!r}")
    if ALL_PARTS in names and len(names) > 1:
        raise ValueError(f"{ALL_PARTS!r} already names every split part, got {value!r}")
    return tuple(dict.fromkeys(names))


def _parts_to_open(path: Path, parts: Sequence[str], split_config: str) -> Tuple[List[str], List[str]]:
    """``(parts with shards, named parts that list none)``, in the order given (``all``: train, val,
    test, then the others by name)."""
    read_info(path)  # an unprepared folder is named as one (with the command to run), not as a missing split.yaml
    defined = read_split_file(path, split_config)["split_parts"]
    if tuple(parts) == (ALL_PARTS,):
        names = sorted(defined, key=lambda p: (_PART_ORDER.index(p) if p in _PART_ORDER else 3, p))
        return [name for name in names if defined[name]], []  # prepare writes empty lists for empty parts
    # an unknown part is left to PreparedDataset.open (its error names the file and the parts it defines)
    return [p for p in parts if p not in defined or defined[p]], [p for p in parts if p in defined and not defined[p]]


def open_local(
    path: Path | str, split_part: str | Sequence[str], trusted: bool, *, split_config: str = "split.yaml",
    dataset_config: str = "dataset.yaml",
) -> LocalDataset:  # fmt: skip
    """Open split parts (a name, names, or ``all``: every part; each shard once) of a prepared folder
    or a ``.jsonl`` file. A named part that lists no shards is left out and named in ``empty_parts``
    (Energon's ``lint``/``preview`` skip it too; when every named part is, no shard is read, but
    ``dataset.yaml`` is still checked); ``split_config``/``dataset_config``: other files in
    ``.nv-meta`` (or a path), as Energon's ``--split-config``/``--dataset-config``.

    Indices are not checked here (``lint`` reports them shard by shard; ``preview`` checks the shards it reads).

    Raises:
        DatasetConfigError: missing or bad ``.nv-meta`` files, an unknown split part, ``all`` where no
            part has shards.
        UntrustedCodeError: ``dataset.yaml`` names code and ``trusted`` is False.
    """
    path = Path(path)
    parts = (split_part,) if isinstance(split_part, str) else tuple(split_part)
    empty: List[str] = []
    try:
        if str(path).endswith(".jsonl"):
            opened = [PreparedDataset.open(path, "train")]
        else:
            names, empty = _parts_to_open(path, parts, split_config)
            opened = [
                PreparedDataset.open(path, part, check=False, trusted=trusted, split_config=split_config,
                                     dataset_config=dataset_config)
                for part in names
            ]  # fmt: skip
        if not opened and not empty:  # `all` of a split file without shards: the dataset has no sample
            raise DatasetConfigError(f"{path}: {split_config} lists no shards in any split part")
        if not opened:  # only named parts without shards: nothing to read, as Energon's (exit 0), but
            # dataset.yaml is still read and checked, as Energon's reads it before it finds the part empty
            spec = read_dataset_spec(path, dataset_config, trusted)
            warn_unknown_keys(spec)
            warn_legacy_class(spec)
            return LocalDataset(root=str(path), split_part=",".join(parts), spec=spec, format="tar", shards=(),
                                empty_parts=tuple(empty))  # fmt: skip
        shards: Dict[str, LocalShard] = {}
        for dataset in opened:
            starts = dataset.shard_starts
            excluded = dataset.excluded_indices()
            for i, info in enumerate(dataset.shards):
                if info.name in shards:
                    continue
                first, end = int(starts[i]), int(starts[i + 1])
                local = frozenset(int(x) - first for x in excluded if first <= x < end)
                shards[info.name] = LocalShard(info=info, start=first, excluded=local)
    except UntrustedCodeError as exc:
        raise with_cli_hint(exc) from None
    first = opened[0]
    return LocalDataset(
        root=first.root, split_part=",".join(parts), spec=first.spec, format=first.format,
        shards=tuple(shards.values()), empty_parts=tuple(empty),
    )  # fmt: skip


class ShardSamples:
    """Raw samples of one shard, as the loader's read stage builds them (parts plus the meta keys).

    Args:
        dataset: the dataset the shard belongs to.
        shard: the shard.

    Raises:
        DatasetConfigError: the shard's ``.tar.idx`` is missing or malformed.
    """

    def __init__(self, dataset: LocalDataset, shard: LocalShard):
        spec = dataset.spec
        self.dataset = dataset
        self.shard = shard
        self.part_filter = spec.wants_part if (spec.parts is not None or spec.part_filter) else None
        self.reader = ShardReader(os.path.abspath(shard.info.path), shard.info.name, read_tar_index(shard.info.path))

    @property
    def count(self) -> int:
        """Samples the shard's index lists."""
        return len(self.reader.offsets) - 1

    def raw(self, index: int) -> Dict[str, Any]:
        """The raw sample ``index`` (within the shard): ``{part: bytes, "__key__": …, …}``.

        Raises:
            ShardReadError: the bytes cannot be read or are no valid tar record.
            IndexMismatchError: the ``.tar.idx`` offset does not fit the tar.
        """
        name = self.shard.info.name
        _, chunk = next(self.reader.read_run(index, index))
        if self.dataset.format == "jsonl":
            key, parts, files = str(index), {"json": bytes(chunk).rstrip(b"\r\n")}, [f"{index}.json"]
        else:
            key, parts, files = self.reader.parse(index, chunk, self.part_filter)
        gindex = self.shard.start + index
        raw: Dict[str, Any] = dict(parts)
        raw["__key__"] = key
        raw["__shard__"] = name
        raw["__restore_key__"] = ("Webdataset", gindex)
        raw["__sources__"] = (
            SourceInfo(dataset_path=self.dataset.root, index=gindex, shard_name=name, file_names=tuple(files)),
        )
        return raw

    def key(self, index: int) -> str:
        """The key of sample ``index`` for messages, ``#index`` when even its first header is unreadable."""
        if self.dataset.format == "jsonl":
            return str(index)
        try:
            return self.reader.read_key(index)
        except (OSError, ValueError):
            pass
        try:  # a shard cut off inside this sample: its first header may still be whole
            with open(self.reader.path, "rb") as file:
                block = os.pread(file.fileno(), _BLOCK, int(self.reader.offsets[index]))
            split = split_member_name(tarfile.TarInfo.frombuf(block, **TAR_ENCODING).name)
        except (OSError, ValueError, tarfile.TarError):
            split = None
        return split[0] if split is not None else f"#{index}"

    def close(self) -> None:
        self.reader.close()


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\n``): a sample key or shard name is the
    dataset's text, and printed as it is, it could move the cursor, clear the screen or start a line of
    its own in a terminal or a report.

    Example:
        >>> printable("k1\\x1b[2J\\nok")
        'k1\\\\x1b[2J\\\\nok'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why a sample (or a shard's index, ``key == "-"``) is bad."""

    shard: str
    key: str
    field: str
    reason: str

    def line(self) -> str:
        """``shard  key  field  reason`` on one line, control characters of the dataset's names escaped."""
        return printable("  ".join((self.shard, self.key, self.field, " ".join(self.reason.split()))))


class SampleChecker:
    """Turns raw samples into the dataset's samples the loader's way, naming every part or field that fails.

    Each part is decoded on its own through the dataset's :class:`SampleLoader`, then each
    ``field_map`` field is looked up on its own, then the sample is built: a sample with a corrupt
    image and a missing caption gives two problems, not one.

    Args:
        spec: the dataset spec.
        decoder: the decoder (the loader's default is ``SampleDecoder()``).
    """

    def __init__(self, spec: DatasetSpec, decoder: Optional[SampleDecoder]):
        self.spec = spec
        self.decoding = SampleLoader(spec, decoder, spec.subflavors)
        # decoded values pass through as they are (a JSONL line's json too)
        self.building = SampleLoader(spec, None, spec.subflavors, parse_json=False)
        self.by_field = {
            name: SampleLoader(dataclasses.replace(spec, field_map={name: options}), None, None)
            for name, options in (spec.field_map or {}).items()
        }

    def field_of(self, part: str) -> str:
        """The field(s) a part feeds (``image`` for ``jpg``), else the part itself."""
        names = [n for n, options in (self.spec.field_map or {}).items() if any(o[0] == part for o in options)]
        return ",".join(names) or part

    def load(self, raw: Dict[str, Any]) -> Tuple[Any, List[Problem]]:
        """``(sample, [])``, or ``(None, problems)``.

        Raises:
            UntrustedCodeError: a part is pickled code and the decoder is not trusted (no bad sample:
                the dataset needs the opt-in).
        """
        shard, key = raw["__shard__"], raw["__key__"]
        prefix = f"{shard}: sample {key!r}: "

        def problem(field: str, exc: Exception) -> Problem:
            text = str(exc)
            return Problem(shard, key, field, text[len(prefix) :] if text.startswith(prefix) else text)

        meta = {k: raw[k] for k in META_KEYS if k in raw}
        decoded = dict(meta)
        problems = []
        for part, data in raw.items():
            if part.startswith("__"):
                continue
            try:
                decoded[part] = self.decoding.decode({**meta, part: data})[part]
            except UntrustedCodeError as exc:
                raise with_cli_hint(exc) from None
            except SampleException as exc:
                problems.append(problem(self.field_of(part), exc))
        for name, loader in self.by_field.items():
            if any(name in p.field.split(",") for p in problems):
                continue
            try:
                loader.fields(decoded)
            except SampleException as exc:
                problems.append(problem(name, exc))
        if problems:
            return None, problems
        try:
            return self.building(decoded), []
        except SampleException as exc:
            return None, [problem("-", exc)]
