"""What a (meta)dataset loader hands back: Energon's ``DatasetLoaderInterface`` and its result types.

``get_datasets`` returns a :class:`LoadedDatasetList` of :class:`LoadedDataset` entries, one per leaf
dataset of the tree, each holding a :class:`LeafDataset` (the opened split part with everything the
tree said about it) and its absolute weight (``blend``) or repetitions (``blend_epochized``).
``traverse`` returns :class:`TraversedDatasetReference` entries without opening anything.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from energon_ray.blend.metadataset import LeafSpec
from energon_ray.format.dataset import PreparedDataset
from energon_ray.plan.sharder import compute_subset
from energon_ray.storage import RemotePath

AnyPath = Union[Path, RemotePath]


class DatasetBlendMode(enum.Enum):
    """How the numbers of a :class:`LoadedDatasetList` combine its datasets."""

    #: one dataset, no weight
    NONE = "none"
    #: ``blend``: each ``LoadedDataset.weight`` is its sampling probability (they sum to 1)
    DATASET_WEIGHT = "dataset_weight"
    #: ``blend_epochized``: each ``LoadedDataset.repetitions`` is how often its samples come per epoch
    SAMPLE_REPETITIONS = "sample_repetitions"

    def __eq__(self, other: object) -> bool:
        # code written against megatron.energon compares with its own DatasetBlendMode members
        if isinstance(other, enum.Enum) and type(other).__name__ == "DatasetBlendMode":
            return self.value == other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)


_MODES = {"none": DatasetBlendMode.NONE, "blend": DatasetBlendMode.DATASET_WEIGHT,
          "blend_epochized": DatasetBlendMode.SAMPLE_REPETITIONS}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LeafDataset:
    """One split part of a prepared dataset as a metadataset reads it (Energon's dataset factory).

    Attributes:
        spec: the leaf as the YAML tree resolved it (path, split part, hierarchy subflavors, subsets).
        prepared: the opened split part (shards and counts; tar indices are checked when a loader is built).
        training: the ``training`` flag of ``get_datasets``.
        kwargs: the extra keyword arguments of ``get_datasets`` (recorded; ``get_*_dataset`` take them).
    """

    spec: LeafSpec
    prepared: PreparedDataset
    training: bool
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def path(self) -> AnyPath:
        """The dataset folder (or ``.jsonl`` file)."""
        return self.spec.path

    @property
    def paths(self) -> Tuple[AnyPath, ...]:
        """``(path,)``, as Energon's factories list their paths."""
        return (self.spec.path,)

    @property
    def split_part(self) -> str:
        return self.spec.split_part

    @property
    def subflavors(self) -> Dict[str, Any]:
        """``dataset.yaml``'s subflavors overridden by the tree's (outer levels win)."""
        return {**self.prepared.spec.subflavors, **self.spec.subflavors}

    @property
    def shuffle_over_epochs(self) -> Optional[int]:
        return self.spec.shuffle_over_epochs

    def subset_range(self) -> Tuple[int, int]:
        """``[start, end)`` sample indices of the split part that the subsets leave."""
        return compute_subset(self.prepared.total, self.spec.absolute, self.spec.ratio)

    def __len__(self) -> int:
        """Samples in the split part, before subsets (Energon's ``len()`` of a dataset factory)."""
        return self.prepared.total


@dataclasses.dataclass
class LoadedDataset:
    """A leaf with its absolute ``weight`` (blend) or ``repetitions`` (blend_epochized); ``aux`` is
    always ``None`` (auxiliary data is not read by energon_ray)."""

    dataset: LeafDataset
    weight: Union[float, int, None] = None
    repetitions: Union[float, int, None] = None
    aux: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class LoadedDatasetList:
    """The leaves of one split and how they combine."""

    datasets: List[LoadedDataset]
    blend_mode: DatasetBlendMode = DatasetBlendMode.NONE


@dataclasses.dataclass
class TraversedDatasetReference:
    """A leaf reached by traversal: resolved path, effective split part, resolved ``aux:`` paths and
    the subflavors of the metadataset levels (not ``dataset.yaml``'s; nothing is opened)."""

    path: AnyPath
    split_part: str
    aux: Dict[str, AnyPath]
    subflavors: Dict[str, Any]


class DatasetLoaderInterface(abc.ABC):
    """Something ``load_dataset`` returns: a prepared dataset or a metadataset."""

    @abc.abstractmethod
    def post_initialize(self, mds_path: Optional[AnyPath] = None) -> None:
        """Resolve and validate the references (``load_dataset`` calls it)."""

    def traverse(self, mds_path: Optional[AnyPath] = None, *, split_part: str,
                 _subflavors: Optional[Dict[str, Any]] = None) -> List[TraversedDatasetReference]:
        """The leaves of ``split_part`` without opening them."""
        raise NotImplementedError(f"{type(self).__name__} does not implement traverse()")

    @abc.abstractmethod
    def get_datasets(self, *, training: bool, split_part: str, worker_config: Any, subflavors: Optional[Dict[str, Any]] = None,
                     shuffle_over_epochs_multiplier: Optional[int] = 1, subset: Optional[dict] = None,
                     **kwargs: Any) -> LoadedDatasetList:
        """Open every leaf of ``split_part`` and resolve its absolute weight or repetitions."""

    def prepare(self, split_part: Optional[str] = None) -> Sequence[AnyPath]:
        """Build on-disk caches; energon_ray has none to build, so this returns ``()``."""
        return ()


def loaded_list(leaves: Sequence[LeafSpec], mode: str, training: bool, kwargs: Dict[str, Any]) -> LoadedDatasetList:
    """Open each leaf and wrap it with the number its blend mode uses (the other stays ``None``).

    ``kwargs["trust_dataset_code"]`` (as in ``get_train_dataset``) decides whether a ``dataset.yaml``
    may name code; it is not recorded on the leaves."""
    from energon_ray.errors import DatasetConfigError, resolve_trust

    kwargs = dict(kwargs)
    trusted = resolve_trust(kwargs.pop("trust_dataset_code", None))
    out = []
    for leaf in leaves:
        try:
            prepared = PreparedDataset.open(leaf.path, leaf.split_part, split_config=leaf.split_config,
                                            dataset_config=leaf.dataset_config, check=False, trusted=trusted)  # fmt: skip
        except DatasetConfigError as exc:
            raise DatasetConfigError(f"{leaf.where}: {exc}") from None
        out.append(
            LoadedDataset(
                dataset=LeafDataset(leaf, prepared, training, dict(kwargs)),
                weight=leaf.weight if mode == "blend" else None,
                repetitions=leaf.repetitions if mode == "blend_epochized" else None,
            )
        )
    return LoadedDatasetList(datasets=out, blend_mode=_MODES[mode])
