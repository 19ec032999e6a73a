"""Energon's dataset factories on energon_ray: a factory opens one split part of a prepared dataset
with Energon's constructor arguments, and ``build()`` returns the dataset ``get_train_dataset`` /
``get_val_dataset`` would build for it (an :class:`~energon_ray.loader.dataset.EnergonDataset`).

The factory's arguments (``sample_type``/``__sample_type__``, ``field_map``, ``sample_loader``,
``part_filter``, ``subflavors``, ``decoder``) take the place of ``dataset.yaml``; the samples are read,
decoded and built by Ray tasks exactly as for a dataset opened by path.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, Type, TypeVar, Union

import braceexpand

from energon_ray.decode.sample_decoder import SampleDecoder, as_sample_decoder, trusting
from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.dataset_code import load_function
from energon_ray.format.dataset_yaml import DatasetSpec, _check_field_map
from energon_ray.format.factory_options import plan_options, set_options
from energon_ray.format.info import meta_dir, write_info
from energon_ray.format.indexer import index_dataset
from energon_ray.format.media_index import MediaFilter, write_media_metadata
from energon_ray.format.prepare import energon_version_string
from energon_ray.format.split import collapse_names, split_by_patterns, split_by_ratio, write_split_file
from energon_ray.samples import CrudeSample, Sample
from energon_ray.storage import as_path
from energon_ray.task_encoder.base import DefaultTaskEncoder
from energon_ray.worker import WorkerConfig

T_sample = TypeVar("T_sample")
#: The decoder a ``DefaultDecoderWebdatasetFactory`` uses unless told otherwise (as Energon's ``DEFAULT_DECODER``).
DEFAULT_DECODER = SampleDecoder()
_FACTORY_CONFIG = "<factory>"



class _CrudePassThrough(DefaultTaskEncoder):
    """The task encoder of a built crude factory without one: crude samples come out as they are read."""

    def cook_crude_sample(self, sample: Any) -> Any:
        return sample


@dataclasses.dataclass
class FactorySpec(DatasetSpec):
    """A :class:`DatasetSpec` from a factory's arguments; it travels to Ray workers by value (code the
    factory loaded from a ``file.py:function`` reference is loaded again there, by reference)."""

    refs: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __reduce__(self):
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for what in self.refs:
            state[what] = None
        return (_rebuild_spec, (state,))


def _rebuild_spec(state: Dict[str, Any]) -> FactorySpec:
    spec = FactorySpec(**state)
    for what, ref in spec.refs.items():
        setattr(spec, what, load_function(ref, meta_dir(spec.root), spec.file, what, spec.trusted))
    return spec


def _generic_sample_type(cls: type) -> Optional[type]:
    """``MySample`` of ``class X(DefaultDecoderWebdatasetFactory[MySample])``, if given that way."""
    for base in getattr(cls, "__orig_bases__", ()):
        for arg in typing.get_args(base):
            if isinstance(arg, type):
                return arg
    return None


class BaseCoreDatasetFactory(Generic[T_sample], ABC):
    """Energon's base of a dataset factory: ``build()`` makes the dataset, ``len()`` counts its samples.

    ``__sample_type__`` is the class of the samples; a subclass declared as ``Factory[MySample]``
    gets ``MySample`` unless it sets ``__sample_type__`` itself.
    """

    __sample_type__: Optional[type] = None
    paths: List[Any]
    subflavors: Dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__sample_type__" not in cls.__dict__:
            found = _generic_sample_type(cls)
            if found is not None:
                cls.__sample_type__ = found

    @abstractmethod
    def build(self, worker_rotation_offset: int = 0) -> Any:
        """The dataset, for ``get_loader`` / ``get_savable_loader``."""

    @abstractmethod
    def __len__(self) -> int:
        """Samples of the split part, over all ranks."""

    def as_file_store(self) -> Any:
        """The dataset's files by name (a ``FileStore``), where a subclass reads files.

        Raises:
            NotImplementedError: a factory that gives no file store.
        """
        raise NotImplementedError(f"{type(self).__name__}.as_file_store: this factory gives no FileStore")


class BaseWebdatasetFactory(BaseCoreDatasetFactory[T_sample], ABC):
    """One split part of a prepared WebDataset, with Energon's constructor arguments.

    Args:
        path: the dataset folder (local or ``s3://``/``msc://``).
        split_part: ``"train"``, ``"val"``, ``"test"`` or another part of the split file.
        training: shuffled and endless (``True``) or one pass in order (``False``).
        worker_config: rank/world/streams (``None``: the default worker config).
        shuffle_over_epochs: slices are shuffled over this many passes (training only).
        parallel_shard_iters: shards read in turn per worker stream.
        max_samples_per_sequence: longest run of consecutive samples of a shard (training only).
        subset: Energon's ``DatasetSubset`` (``absolute_range``, then ``range``).
        split_config: the split file inside ``.nv-meta``.
        part_filter: which tar parts are read (``None``: all).
        trust_dataset_code: allow ``file.py:function`` references (loaded from ``.nv-meta``).

    Raises:
        DatasetConfigError: a missing or bad ``.nv-meta``, an unknown split part, an index that
            disagrees with its tar, or no sample type.
    """

    def __init__(
        self,
        path: Any,
        *,
        split_part: str,
        training: bool,
        worker_config: Optional[WorkerConfig] = None,
        shuffle_over_epochs: Optional[int] = 1,
        parallel_shard_iters: Optional[int] = None,
        max_samples_per_sequence: Optional[int] = None,
        subset: Any = None,
        split_config: Optional[str] = None,
        part_filter: Optional[Callable[[str], bool]] = None,
        trust_dataset_code: Optional[bool] = None,
    ):
        if self.__sample_type__ is None:
            raise DatasetConfigError(f"{type(self).__name__}: set __sample_type__ (or declare it as {type(self).__name__}[MySample])")
        set_options(
            self, as_path(path) if "://" in str(path) else Path(str(path)), split_part=split_part, training=training,
            worker_config=worker_config, shuffle_over_epochs=shuffle_over_epochs, parallel_shard_iters=parallel_shard_iters,
            max_samples_per_sequence=max_samples_per_sequence, subset=subset, part_filter=part_filter,
            trust_dataset_code=trust_dataset_code,
        )  # fmt: skip
        self.prepared = PreparedDataset.open(
            self.path, split_part, split_config=split_config, trusted=self.trusted, spec=self._spec(str(self.path))
        )
        self.shards = list(self.prepared.shards)

    # -- what subclasses say about their samples ------------------------------------------------
    def _spec(self, root: str) -> DatasetSpec:
        # the spec's root absolute: its code (file.py:function) is loaded again in Ray workers, whose
        # current directory is not the caller's
        spec = FactorySpec(
            file=f"{root} ({type(self).__name__})", root=root if "://" in root else os.path.abspath(root),
            dataset_config=_FACTORY_CONFIG, sample_type=self.__sample_type__, trusted=self.trusted,
        )  # fmt: skip
        spec.part_filter = self.part_filter
        return spec

    def _decoder(self) -> Optional[SampleDecoder]:
        """Raw bytes unless a subclass decodes."""
        return None

    # -- Energon's interface --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.prepared.total

    def as_file_store(self) -> Any:
        """The dataset's files by ``"<sample key>.<part>"`` (a ``DatasetFileStore``, as Energon's
        ``WebdatasetFileStore``)."""
        from energon_ray.cache.stores import DatasetFileStore

        return DatasetFileStore(self.path)

    def sample_filter(self, key: str) -> bool:
        """Whether sample ``shard/key`` is not excluded by the split file."""
        return key not in self.prepared.sample_excludes

    def build(
        self, worker_rotation_offset: int = 0, *, task_encoder: Any = None, batch_size: Optional[int] = None,
        batch_drop_last: bool = False, shuffle_buffer_size: Optional[int] = None,
    ) -> Any:  # fmt: skip
        """The dataset (an ``EnergonDataset``): samples of ``__sample_type__``, unbatched unless
        ``batch_size`` is given; ``task_encoder`` (default: none) runs its hooks on them."""
        from energon_ray.loader.dataset import EnergonDataset

        if task_encoder is None:
            task_encoder = _CrudePassThrough() if self.prepared.spec.is_crude else DefaultTaskEncoder()
        options = plan_options(self, batch_size, batch_drop_last, shuffle_buffer_size)
        decoder = self._decoder()
        if decoder is not None and self.trusted:
            decoder = trusting(decoder)
        return EnergonDataset(
            self.prepared, worker_config=self.worker_config, task_encoder=task_encoder, options=options,
            decoder=decoder, subflavors=self.subflavors, rotation_offset=worker_rotation_offset,
        )  # fmt: skip

    def config(self) -> Dict[str, Any]:
        return dict(
            type=type(self).__qualname__, training=self.training, _path=str(self.path),
            shards=[dict(name=s.name, count=s.count, _path=s.path) for s in self.shards],
            sample_excludes=sorted(self.prepared.sample_excludes), shuffle_over_epochs=self.shuffle_over_epochs,
            parallel_shard_iters=self.parallel_shard_iters, max_samples_per_sequence=self.max_samples_per_sequence,
        )  # fmt: skip

    def __str__(self) -> str:
        return f"{type(self).__name__}(path={self.path})"

    __repr__ = __str__

    @staticmethod
    def prepare_dataset(
        parent_path: Any,
        paths: Sequence[str],
        *,
        split_parts_ratio: Optional[Sequence[Tuple[str, float]]] = None,
        split_parts_patterns: Optional[Sequence[Tuple[str, str]]] = None,
        split_config: str = "split.yaml",
        shuffle_seed: Optional[int] = 42,
        progress_fn: Any = None,
        workers: int = 32,
        tar_index_only: bool = False,
        media_filter: Any = None,
        fix_duplicates: bool = False,
        index_sqlite_tmp_path: Any = None,
    ) -> set:
        """Energon's ``prepare_dataset``: index the shards ``paths`` (brace patterns, relative to
        ``parent_path``), write ``.nv-meta/.info.json``, ``index.sqlite``, ``index.uuid`` and the split
        file, the same files ``energon-ray prepare`` and ``energon prepare`` write.

        Args:
            split_parts_ratio: ``[(part, weight), ...]``: whole shards in that order of parts (after a
                ``random.Random(shuffle_seed)`` shuffle unless ``shuffle_seed`` is None).
            split_parts_patterns: ``[(part, regex), ...]`` instead (brace-expanded, ``re.match``).
            tar_index_only: only (re)write the shards' indexes.
            workers: processes indexing shards in parallel (at most one per shard).
            media_filter: also store media metadata in ``index.sqlite`` (a ``MediaFilter``, or
                Energon's ``MediaFilterConfig``; see :mod:`energon_ray.format.media_index`).
            index_sqlite_tmp_path: for a remote ``parent_path``, a local file path whose folder is
                where ``index.sqlite`` is built before it is uploaded (as Energon's).

        Returns:
            The part names (``jpg``, ``txt``…) found in the shards.

        Raises:
            ValueError: neither or both split arguments; ``media_filter`` with ``tar_index_only``;
                ``fix_duplicates`` (not supported).
            DatasetConfigError: a bad shard or a duplicate sample key.
        """
        if fix_duplicates:
            raise ValueError("prepare_dataset: fix_duplicates is not supported by energon_ray")
        if media_filter is not None and tar_index_only:
            raise ValueError("prepare_dataset: media_filter cannot be combined with tar_index_only")
        root = as_path(parent_path)
        names = [e for p in paths for e in braceexpand.braceexpand(str(p))]
        if not names:
            raise ValueError("prepare_dataset needs at least one shard path")
        scratch = None if index_sqlite_tmp_path is None else Path(index_sqlite_tmp_path).parent
        num_workers = max(1, min(int(workers), len(names)))
        counts, parts = index_dataset(root, names, num_workers=num_workers, progress=False, scratch_dir=scratch)
        if tar_index_only:
            return set(parts)
        if (split_parts_ratio is None) == (split_parts_patterns is None):
            raise ValueError("prepare_dataset needs exactly one of split_parts_ratio or split_parts_patterns")
        if media_filter is not None:
            write_media_metadata(
                root, MediaFilter.coerce(media_filter), shards=names, scratch_dir=scratch, num_workers=num_workers
            )
        write_info(root, counts, energon_version_string())
        if split_parts_ratio is not None:
            part_names = [str(p) for p, _ in split_parts_ratio]
            ratio = [float(w) for _, w in split_parts_ratio]
            shuffle = shuffle_seed is not None
            splits = split_by_ratio(names, ratio, shuffle, parts=part_names, seed=shuffle_seed if shuffle else 42)
        else:
            patterns: Dict[str, List[str]] = {}
            for part, pattern in split_parts_patterns or ():
                patterns.setdefault(str(part), []).append(str(pattern))
            splits = split_by_patterns(names, patterns)
        write_split_file(root, {p: collapse_names(s) for p, s in splits.items()}, split_config=split_config)
        return set(parts)


class DefaultGenericWebdatasetFactory(BaseWebdatasetFactory[T_sample]):
    """Samples from the raw parts (no decoding) by ``field_map`` or ``sample_loader`` + ``part_filter``.

    Args:
        subflavors: set on every sample (``__subflavors__``).
        field_map: ``{field: part}`` (Energon's field access syntax: ``json[key][0]``).
        sample_loader: ``fn(raw: dict) -> dict of fields``, or ``"file.py:function"`` in ``.nv-meta``.
        part_filter: the parts a ``sample_loader`` needs: a list, a callable or ``"file.py:function"``.
        **kwargs: as :class:`BaseWebdatasetFactory`.

    Raises:
        DatasetConfigError: both or neither of ``field_map``/``sample_loader``; a field the sample type lacks.
        UntrustedCodeError: a ``file.py:function`` reference without ``trust_dataset_code=True``.
    """

    def __init__(
        self,
        path: Any,
        *,
        subflavors: Optional[Dict[str, Any]] = None,
        field_map: Optional[Dict[str, str]] = None,
        sample_loader: Optional[Union[str, Callable[[dict], dict]]] = None,
        part_filter: Optional[Union[str, List[str], Callable[[str], bool]]] = None,
        **kwargs: Any,
    ):
        if (field_map is None) == (sample_loader is None):
            raise DatasetConfigError(f"{path}: {type(self).__name__} needs exactly one of field_map or sample_loader")
        if sample_loader is not None and part_filter is None:
            raise DatasetConfigError(f"{path}: {type(self).__name__}: a sample_loader needs a part_filter")
        if field_map is not None and part_filter is not None:
            raise DatasetConfigError(f"{path}: {type(self).__name__}: part_filter cannot be combined with field_map")
        self.subflavors = dict(subflavors or {})
        self._field_map, self._sample_loader, self._part_filter = field_map, sample_loader, part_filter
        super().__init__(path, **kwargs)

    def _spec(self, root: str) -> DatasetSpec:
        spec = super()._spec(root)
        if self.__sample_type__ is CrudeSample or (isinstance(self.__sample_type__, type) and issubclass(self.__sample_type__, CrudeSample)):
            spec.sample_type = CrudeSample
        if self._field_map is not None:
            spec.field_map = _check_field_map(dict(self._field_map), self.__sample_type__, spec.file)
            spec.parts = frozenset(option[0] for options in spec.field_map.values() for option in options)
            return spec
        meta = meta_dir(root)
        for what, ref in (("sample_loader", self._sample_loader), ("part_filter", self._part_filter)):
            if isinstance(ref, str):
                spec.refs[what] = ref
                setattr(spec, what, load_function(ref, meta, spec.file, what, self.trusted))
            elif isinstance(ref, (list, tuple, set, frozenset)):
                spec.parts = frozenset(ref)
            elif callable(ref):
                setattr(spec, what, ref)
            else:
                raise DatasetConfigError(f"{spec.file}: {what} must be a callable or 'file.py:function', got {ref!r}")
        if spec.sample_type is CrudeSample and spec.sample_loader is not None and not spec.refs.get("sample_loader"):
            spec.sample_loader = None  # crude samples are the parts themselves
        return spec


class DefaultDecoderWebdatasetFactory(DefaultGenericWebdatasetFactory[T_sample]):
    """As :class:`DefaultGenericWebdatasetFactory`, with the parts decoded by ``decoder`` first
    (default: ``SampleDecoder()``; ``None`` keeps bytes)."""

    def __init__(self, path: Any, *, decoder: Optional[SampleDecoder] = DEFAULT_DECODER, **kwargs: Any):
        self._sample_decoder = as_sample_decoder(decoder)
        super().__init__(path, **kwargs)

    def _decoder(self) -> Optional[SampleDecoder]:
        return self._sample_decoder

    def config(self) -> Dict[str, Any]:
        decoder = self._sample_decoder.config() if self._sample_decoder is not None else {}
        return {**super().config(), **decoder}


class StandardWebdatasetFactory(DefaultDecoderWebdatasetFactory[T_sample]):
    """The factory for a ``sample_type`` given as an argument (what ``dataset.yaml``'s ``sample_type`` makes).

    Raises:
        TypeError: ``sample_type`` is not a ``Sample`` subclass.
    """

    def __init__(self, path: Any, *, sample_type: Type[T_sample], **kwargs: Any):
        if not (isinstance(sample_type, type) and issubclass(sample_type, Sample)):
            raise TypeError(f"sample_type must be a subclass of energon_ray.Sample, got {sample_type!r}")
        self.__sample_type__ = sample_type
        super().__init__(path, **kwargs)


def is_factory_class(value: Any) -> bool:
    """Whether ``value`` is a dataset factory class (ours or a user's subclass)."""
    return isinstance(value, type) and issubclass(value, BaseCoreDatasetFactory)
