"""``JoinedEnergonDataset``: an :class:`EnergonDataset` over the rows of a join table.

The rows (one per primary sample that survived ``nonmatch``) are planned like the samples of one
shard, as Energon slices a joined dataset's rows over workers; a segment's Ray task reads the
samples of every joined dataset of its rows, builds each with its own dataset's loader and calls
the joiner.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.join_index import build_join_table
from energon_ray.loader.dataset import EnergonDataset
from energon_ray.pipeline.join_load import JoinedSampleLoader, resolve_joiner
from energon_ray.pipeline.load import SampleLoader
from energon_ray.pipeline.shipping import Shipped
from energon_ray.source.joined_reader import JoinedReadSegment
from energon_ray.source.reader import shard_table
from energon_ray.worker import WorkerConfig


class _JoinedView:
    """What the planner reads of a dataset, for the join table's rows (one virtual shard)."""

    def __init__(self, primary: PreparedDataset, rows: int):
        self.primary = primary
        self.rows = rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.primary, name)

    @property
    def total(self) -> int:
        return self.rows

    @property
    def shard_starts(self) -> np.ndarray:
        return np.asarray([0, self.rows], dtype=np.int64)

    @property
    def sample_excludes(self) -> frozenset:
        return frozenset()  # already left out of the join table

    def describe(self) -> str:
        return f"join of {self.primary.root} [{self.primary.split_part}: {self.rows} joined samples]"


class JoinedEnergonDataset(EnergonDataset):
    """A planned joined dataset (``join:`` metadataset, ``JoinedWebdatasetFactory``).

    Args:
        datasets: the joined datasets, primary first.
        join: the join table (:func:`energon_ray.format.join_index.build_join_table`).
        joiner: merges the samples of a row (``Sample.from_joined`` or a function).
        names: the mapping join's names (``None``: positional).
        member_subflavors: per dataset, the subflavors of its reference (over its dataset.yaml's).
        member_decoders: per dataset, its decoder (default: ``decoder`` for all; a factory's own).
        **kwargs: as :class:`EnergonDataset` (``subflavors`` apply to every dataset).
    """

    def __init__(
        self,
        datasets: Sequence[PreparedDataset],
        *,
        join: np.ndarray,
        joiner: Callable[..., Any],
        names: Optional[List[str]] = None,
        member_subflavors: Optional[Sequence[Optional[Dict[str, Any]]]] = None,
        member_decoders: Optional[Sequence[Any]] = None,
        worker_config: WorkerConfig,
        **kwargs: Any,
    ):
        self.datasets = list(datasets)
        self.join = join
        self.joiner = joiner
        self.names = names
        self.member_subflavors = [dict(s or {}) for s in (member_subflavors or [None] * len(self.datasets))]
        self.member_decoders = list(member_decoders) if member_decoders is not None else None
        super().__init__(_JoinedView(self.datasets[0], len(join)), worker_config=worker_config, **kwargs)  # type: ignore[arg-type]
        self._operator_name = "EnergonJoinedSegments"

    def _check_hooks(self) -> None:
        for dataset in self.datasets:
            self.dataset = dataset
            super()._check_hooks()
        self.dataset = _JoinedView(self.datasets[0], len(self.join))  # type: ignore[assignment]

    def stage_config(self):
        if self._stages is None:
            stages = super().stage_config()
            decoders = self.member_decoders or [self.decoder] * len(self.datasets)
            loaders = [
                SampleLoader(ds.spec, decoder, {**ds.spec.subflavors, **own})
                for ds, own, decoder in zip(self.datasets, self.member_subflavors, decoders)
            ]  # fmt: skip
            stages.loader = Shipped(JoinedSampleLoader(loaders, self.joiner, self.names), "joined sample loader")
        return self._stages

    def reader(self) -> JoinedReadSegment:
        filters = [ds.spec.wants_part if (ds.spec.parts is not None or ds.spec.part_filter) else None for ds in self.datasets]
        return JoinedReadSegment(
            [shard_table(ds) for ds in self.datasets], filters, self.join,
            tolerance=self.task_encoder.__default_failure_tolerance__,
        )  # fmt: skip

    def joined_rows_digest(self) -> str:
        """A digest of the join table (the sample of each dataset every row joins): a state's positions
        are rows of it, and an exclude or a key changed in any dataset can change them, count or not."""
        table = np.ascontiguousarray(self.join, dtype=np.int64)
        return hashlib.sha256(repr(table.shape).encode() + table.tobytes()).hexdigest()[:16]

    def config(self) -> Dict[str, Any]:
        out = super().config()
        out.update(type="JoinedEnergonDataset", paths=[ds.root for ds in self.datasets], rows=len(self.join),
                   joiner=getattr(self.joiner, "__qualname__", repr(self.joiner)), names=self.names)  # fmt: skip
        return out

    def __repr__(self) -> str:
        return "Joined" + super().__repr__()


def open_join_members(join: Any, trusted: bool) -> List[PreparedDataset]:
    """Open the datasets of a ``join:`` node (a :class:`energon_ray.blend.join.JoinSpec`), primary first."""
    from energon_ray.format.dataset_yaml import check_field_map_parts
    from energon_ray.format.tar_index import read_tar_index

    out = []
    for member in join.members:
        prepared = PreparedDataset.open(
            member.path, member.split_part, split_config=member.split_config, dataset_config=member.dataset_config,
            trusted=trusted,
        )  # fmt: skip
        if prepared.format != "tar":
            raise DatasetConfigError(f"{member.path}: only prepared WebDataset (tar) datasets can be joined")
        firsts = [(s.path, int(read_tar_index(s.path)[0])) for s in prepared.shards if s.count][:3]
        check_field_map_parts(prepared.spec, firsts)
        out.append(prepared)
    return out


def joined_dataset(join: Any, members: Sequence[PreparedDataset], options: Any, common: Dict[str, Any], trusted: bool,
                   offset: int, global_workers: int) -> JoinedEnergonDataset:  # fmt: skip
    """The :class:`JoinedEnergonDataset` of a metadataset's ``join:`` node (``offset``: samples before it)."""
    where = f"{join.file}: {join.where}"
    table = build_join_table(members, [m.nonmatch for m in join.members], where)
    joiner = resolve_joiner(join.joiner, join.file, trusted)
    try:
        return JoinedEnergonDataset(
            members, join=table, joiner=joiner, names=join.names, member_subflavors=[m.subflavors for m in join.members],
            options=options, rotation_offset=offset % global_workers, rotation_base=offset, **common,
        )  # fmt: skip
    except ValueError as exc:
        raise DatasetConfigError(f"{where}: {exc}") from None
