"""``JoinedWebdatasetFactory``: Energon's factory of a joined dataset on energon_ray.

It takes Energon's arguments: the inner dataset factories (a list, or a mapping whose names the
joiner gets as keywords), the join index file that Energon's ``prepare_metadataset`` writes
(``<metadataset>.cache/join_index_<hash>.bin``) and the joiner. ``build()`` returns the
:class:`~energon_ray.loader.joined.JoinedEnergonDataset` that reads the rows of that index on Ray.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type, Union

import numpy as np

from energon_ray.decode.sample_decoder import trusting
from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.factories import BaseCoreDatasetFactory, BaseWebdatasetFactory
from energon_ray.format.factory_options import check_training, plan_options, subset_ranges
from energon_ray.format.join_index import MISSING
from energon_ray.format.tar_index import read_tar_index
from energon_ray.samples import Sample
from energon_ray.storage import as_path
from energon_ray.task_encoder.base import DefaultTaskEncoder
from energon_ray.worker import WorkerConfig

_MAGIC = b"JIDX0001"


def read_join_index(path: Any, datasets: Sequence[PreparedDataset]) -> np.ndarray:
    """The join table (rows × datasets of global sample indices, ``-1``: none) of Energon's join index.

    The file is ``JIDX0001``, the column count (int64), then per row and column ``(shard in the split
    part, byte offset of the sample in its tar, byte size)`` as int64 (``-1``: no sample).

    Raises:
        DatasetConfigError: a missing or malformed file, a column count other than ``len(datasets)``,
            or an offset where the shard's ``.tar.idx`` has no sample (the index is outdated).
    """
    file = as_path(str(path))
    if not file.is_file():
        raise DatasetConfigError(f"{file}: join index does not exist; run prepare_metadataset on the metadataset first")
    data = file.read_bytes()
    if data[:8] != _MAGIC or len(data) < 16:
        raise DatasetConfigError(f"{file}: not a join index (expected magic {_MAGIC!r}, got {data[:8]!r})")
    (columns,) = struct.unpack("q", data[8:16])
    if columns != len(datasets):
        raise DatasetConfigError(f"{file}: join index has {columns} columns, but {len(datasets)} datasets are joined")
    if (len(data) - 16) % (24 * columns):
        raise DatasetConfigError(f"{file}: join index size {len(data)} is not a whole number of rows")
    raw = np.frombuffer(data, dtype="<i8", offset=16).reshape(-1, columns, 3)
    table = np.full(raw.shape[:2], MISSING, dtype=np.int64)
    for d, ds in enumerate(datasets):
        starts = ds.shard_starts
        for shard in np.unique(raw[:, d, 0]):
            if shard < 0:
                continue
            if shard >= len(ds.shards):
                raise DatasetConfigError(f"{file}: column {d} names shard #{shard}, but {ds.root} has {len(ds.shards)}")
            rows = raw[:, d, 0] == shard
            offsets = np.asarray(read_tar_index(ds.shards[shard].path), dtype=np.int64)[:-1]
            local = np.searchsorted(offsets, raw[rows, d, 1])
            bad = (local >= len(offsets)) | (offsets[np.minimum(local, len(offsets) - 1)] != raw[rows, d, 1])
            if bad.any():
                raise DatasetConfigError(
                    f"{file}: byte offset {int(raw[rows, d, 1][bad][0])} is no sample of {ds.shards[shard].path}; "
                    "the join index is outdated: prepare the metadataset again"
                )
            table[rows, d] = int(starts[shard]) + local
    return table


class JoinedWebdatasetFactory(BaseCoreDatasetFactory[Any]):
    """Samples of several prepared datasets joined row by row of a join index (Energon's arguments).

    Args:
        inner_datasets: the joined webdataset factories (primary first), a list (the joiner gets the
            samples positionally) or a mapping (by name).
        training: shuffled and endless (``True``) or one pass in order (``False``).
        worker_config: rank/world/streams.
        shuffle_over_epochs, parallel_shard_iters, max_samples_per_sequence, subset: as for
            :class:`~energon_ray.format.factories.BaseWebdatasetFactory`, over the joined rows.
        join_index: the join index file Energon's ``prepare_metadataset`` wrote.
        joiner: a sample type (its ``from_joined``) or a function building one sample.

    Raises:
        DatasetConfigError: see :func:`read_join_index`; TypeError: an inner dataset is no webdataset factory.
    """

    def __init__(
        self,
        inner_datasets: Union[Sequence[BaseWebdatasetFactory], Mapping[str, BaseWebdatasetFactory]],
        *,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: Optional[int] = 1,
        parallel_shard_iters: Optional[int] = None,
        max_samples_per_sequence: Optional[int] = None,
        subset: Any = None,
        join_index: Any,
        joiner: Union[Type[Any], Callable[..., Any]],
    ):
        check_training("JoinedWebdatasetFactory", training)
        if isinstance(inner_datasets, Mapping):
            self.inner_dataset_keys: Optional[List[str]] = [str(k) for k in inner_datasets]
            inner = list(inner_datasets.values())
        else:
            self.inner_dataset_keys, inner = None, list(inner_datasets)
        for i, ds in enumerate(inner):
            if not isinstance(ds, BaseWebdatasetFactory):
                raise TypeError(f"JoinedWebdatasetFactory: inner dataset #{i} must be a webdataset factory, got {type(ds).__name__}")
        if not inner:
            raise TypeError("JoinedWebdatasetFactory: needs at least one inner dataset")
        if isinstance(joiner, type) and issubclass(joiner, Sample):
            self._sample_joiner: Callable[..., Any] = joiner.from_joined
        elif callable(joiner):
            self._sample_joiner = joiner
        else:
            raise TypeError(f"JoinedWebdatasetFactory: joiner must be a sample type or a callable, got {joiner!r}")
        self.__sample_type__ = joiner
        self.inner_datasets = inner
        self.training = training
        self.worker_config = worker_config
        self.shuffle_over_epochs = shuffle_over_epochs
        self.parallel_shard_iters = parallel_shard_iters
        self.max_samples_per_sequence = max_samples_per_sequence
        self.subset = subset
        self.join_index = join_index
        self.paths = [ds.path for ds in inner]
        subset_ranges(self)  # a bad subset is refused here, not when the dataset is planned
        self.subflavors: Dict[str, Any] = {}
        self.shards = list(zip(*(ds.shards for ds in inner)))
        self._table = read_join_index(join_index, [ds.prepared for ds in inner])

    def __len__(self) -> int:
        # Energon's: the primary's samples (a skipping join has fewer rows; len(build()) counts those)
        return len(self.inner_datasets[0])

    def build(
        self, worker_rotation_offset: int = 0, *, task_encoder: Any = None, batch_size: Optional[int] = None,
        batch_drop_last: bool = False, shuffle_buffer_size: Optional[int] = None,
    ) -> Any:  # fmt: skip
        """The dataset (a ``JoinedEnergonDataset``) of joined samples, unbatched unless ``batch_size`` is given."""
        from energon_ray.loader.joined import JoinedEnergonDataset

        options = plan_options(self, batch_size, batch_drop_last, shuffle_buffer_size)
        decoders = []
        for ds in self.inner_datasets:
            decoder = ds._decoder()
            decoders.append(trusting(decoder) if decoder is not None and ds.trusted else decoder)
        return JoinedEnergonDataset(
            [ds.prepared for ds in self.inner_datasets], join=self._table, joiner=self._sample_joiner,
            names=self.inner_dataset_keys, member_subflavors=[ds.subflavors for ds in self.inner_datasets],
            member_decoders=decoders, worker_config=self.worker_config,
            task_encoder=task_encoder if task_encoder is not None else DefaultTaskEncoder(), options=options,
            decoder=decoders[0], rotation_offset=worker_rotation_offset,
        )  # fmt: skip

    def config(self) -> Dict[str, Any]:
        return dict(
            type=type(self).__qualname__, joined_datasets=[ds.config() for ds in self.inner_datasets],
            training=self.training, shuffle_over_epochs=self.shuffle_over_epochs,
            parallel_shard_iters=self.parallel_shard_iters, max_samples_per_sequence=self.max_samples_per_sequence,
        )  # fmt: skip

    def __str__(self) -> str:
        return f"{type(self).__name__}(paths={[str(p) for p in self.paths]})"

    __repr__ = __str__
