"""``PreparedDataset``: one split part of a prepared dataset, validated before any Ray task runs."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset_yaml import DatasetSpec, read_dataset_spec, warn_legacy_class, warn_unknown_keys
from energon_ray.format.info import read_info
from energon_ray.format.split import resolve_split_part
from energon_ray.format.tar_index import check_tar_index, read_tar_index
from energon_ray.format.tar_reader import open_shard_reader
from energon_ray.storage import RemotePath, as_path, settings_of


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A shard of the split: name relative to the dataset, absolute path (or URL), sample count."""

    name: str
    path: str
    count: int


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
    """The shards of one split part, the sample excludes and the dataset spec.

    Sample indices are global over the split's shards in split-file order (Energon's
    ``("Webdataset", index)`` restore keys).
    """

    root: str
    split_part: str
    shards: Tuple[ShardInfo, ...]
    sample_excludes: frozenset
    spec: DatasetSpec
    split_config: str = "split.yaml"
    dataset_config: str = "dataset.yaml"
    #: ``"tar"`` (WebDataset shards) or ``"jsonl"`` (one JSON object per line).
    format: str = "tar"
    #: How a remote dataset's store is reached (``None``: local); travels with the read tasks.
    storage: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def open(
        cls,
        path: Path | str | RemotePath,
        split_part: str,
        *,
        split_config: Optional[str] = None,
        dataset_config: Optional[str] = None,
        check: bool = True,
        trusted: bool = False,
        spec: Optional[DatasetSpec] = None,
    ) -> "PreparedDataset":
        """Read ``.nv-meta`` and validate every shard's ``.tar.idx`` against its tar.

        ``path`` may be a local folder or an ``s3://``/``msc://`` URL (see :mod:`energon_ray.storage`);
        ``spec``: how samples are built (default: read from ``dataset.yaml``; a dataset factory gives its own).

        Raises:
            DatasetConfigError: missing ``.nv-meta``, unknown split part, bad dataset.yaml, or an
                index that disagrees with its tar — each naming the file and the value.
            StorageError: a remote store refused a request or stayed unavailable (naming the URL).
        """
        root = as_path(path)
        if str(root).endswith(".jsonl"):
            from energon_ray.format.jsonl import open_jsonl

            if not root.is_file():
                raise DatasetConfigError(f"{root}: JSONL file does not exist")
            return open_jsonl(root, split_part)
        split_config = split_config or "split.yaml"
        dataset_config = dataset_config or "dataset.yaml"
        counts = read_info(root)
        part = resolve_split_part(root, split_part, counts, split_config)
        if spec is None:  # a dataset factory brings its own (its arguments instead of dataset.yaml)
            spec = read_dataset_spec(root, dataset_config, trusted)
            warn_unknown_keys(spec)
            warn_legacy_class(spec)
        shards = tuple(ShardInfo(name=n, path=str(root / n), count=counts[n]) for n in part.shards)
        dataset = cls(
            root=str(root),
            split_part=split_part,
            shards=shards,
            sample_excludes=part.sample_excludes,
            spec=spec,
            split_config=split_config,
            dataset_config=dataset_config,
            storage=settings_of(root),
        )
        if check:
            def check_one(shard: ShardInfo) -> None:
                check_tar_index(shard.path, read_tar_index(shard.path, root), shard.count)

            if isinstance(root, RemotePath):  # two requests per shard: overlap them
                with ThreadPoolExecutor(max_workers=16) as pool:
                    list(pool.map(check_one, shards))
            else:
                for shard in shards:
                    check_one(shard)
        return dataset

    @property
    def total(self) -> int:
        """Number of samples in the split part (excluded samples included)."""
        return int(sum(s.count for s in self.shards))

    @property
    def shard_starts(self) -> np.ndarray:
        """Global index of each shard's first sample, plus the total at the end."""
        return np.concatenate([[0], np.cumsum([s.count for s in self.shards])]).astype(np.int64)

    def excluded_indices(self) -> np.ndarray:
        """Sorted global indices of samples excluded by ``shard/key`` entries of the split file.

        Only shards named by an exclude entry are touched, and only their tar headers are read.
        """
        by_shard: Dict[str, set] = {}
        for entry in self.sample_excludes:
            for shard in self.shards:
                prefix = shard.name + "/"
                if entry.startswith(prefix):
                    by_shard.setdefault(shard.name, set()).add(entry[len(prefix) :])
        starts = self.shard_starts
        out = []
        if self.format != "tar":
            return np.empty(0, dtype=np.int64)
        for i, shard in enumerate(self.shards):
            keys = by_shard.get(shard.name)
            if not keys:
                continue
            reader = open_shard_reader(shard.path, shard.name, read_tar_index(shard.path), self.storage)
            try:
                out.extend(int(starts[i]) + j for j in range(shard.count) if reader.read_key(j) in keys)
            finally:
                reader.close()
        return np.asarray(sorted(out), dtype=np.int64)

    def describe(self) -> str:
        return f"{self.root} [{self.split_part}: {len(self.shards)} shards, {self.total} samples]"
