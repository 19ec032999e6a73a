"""Energon's metadataset objects over the YAML parser: ``load_dataset``, ``DatasetLoader``,
``Metadataset`` (V1), ``MetadatasetV2``, ``traverse_metadataset``, ``prepare_metadataset``.

The tree is read by :mod:`energon_ray.blend.metadataset` (one parser for these objects and for
``get_train_dataset``/``get_val_dataset``); these classes hold the YAML's ``splits`` and flatten one
split when asked.

Example (traversal opens nothing, so the referenced folders need not exist):
    >>> import tempfile, pathlib
    >>> mix = pathlib.Path(tempfile.mkdtemp()) / "mix.yaml"
    >>> _ = mix.write_text(
    ...     "__class__: MetadatasetV2\\nsplits:\\n  train:\\n    blend:\\n"
    ...     "      - {weight: 3, path: a}\\n      - {weight: 1, path: b, subflavors: {src: b}}\\n")
    >>> [(ref.path.name, ref.split_part, ref.subflavors) for ref in traverse_metadataset(mix, split_part="train")]
    [('a', 'train', {}), ('b', 'train', {'src': 'b'})]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from energon_ray.blend.loaded import (
    AnyPath,
    DatasetLoaderInterface,
    LoadedDatasetList,
    TraversedDatasetReference,
    loaded_list,
)
from energon_ray.blend.metadataset import (
    Flattened,
    LeafSpec,
    _as_path,
    parse,
    read_file,
    stands_for,
    start_context,
)
from energon_ray.blend.metadataset_values import absolute_subset_error, combine_multipliers, parse_subset
from energon_ray.errors import DatasetConfigError
from energon_ray.format.info import INFO_JSON, INFO_YAML, meta_dir
from energon_ray.worker import WorkerConfig

DICT_LABEL = "<metadataset dict>"


def _check_worker_config(worker_config: Any) -> None:
    if worker_config is not None and not isinstance(worker_config, WorkerConfig):
        raise TypeError(f"worker_config must be an energon_ray.WorkerConfig or None, got {type(worker_config).__name__}")


def _caller_subset(subset: Optional[Mapping], what: str):
    """``get_datasets(subset={"range": [a, b]})``: the YAML's form, checked by the same parser."""
    if subset is None:
        return None, None
    if not isinstance(subset, Mapping):
        raise TypeError(f"subset must be a mapping like {{'range': ['0%', '50%']}} or None, got {subset!r}")
    return parse_subset({"subset": dict(subset)}, what, "get_datasets(subset=...)")


class DatasetLoader(DatasetLoaderInterface):
    """A prepared dataset folder (or ``.jsonl`` file) as a one-leaf loader.

    Args:
        path: the dataset.
        split_part: the split part to read whatever ``get_datasets`` asks for (``None``: the caller's).
        subflavors: the dataset's subflavors (the caller's win on a conflict).
        shuffle_over_epochs_multiplier: multiplies the caller's (``None`` anywhere: no shuffle).
        dataset_config: another file than ``.nv-meta/dataset.yaml``.
        split_config: another file than ``.nv-meta/split.yaml``.
    """

    def __init__(self, path: Any, split_part: Optional[str] = None, subflavors: Optional[Dict[str, Any]] = None,
                 shuffle_over_epochs_multiplier: Optional[int] = 1, dataset_config: Optional[str] = None,
                 split_config: Optional[str] = None) -> None:  # fmt: skip
        self.path = _as_path(path)
        self.split_part = split_part
        self.subflavors = subflavors
        self.shuffle_over_epochs_multiplier = shuffle_over_epochs_multiplier
        self.dataset_config = dataset_config
        self.split_config = split_config

    def __repr__(self) -> str:
        return f"DatasetLoader(path={str(self.path)!r}, split_part={self.split_part!r})"

    def post_initialize(self, mds_path: Optional[AnyPath] = None) -> None:
        if not _is_prepared(self.path):
            raise DatasetConfigError(f"{self.path}: not a prepared dataset (no .nv-meta/{INFO_JSON}) or .jsonl file")

    def _leaf(self, split_part: str, subflavors, multiplier, subset) -> LeafSpec:
        ratio, absolute = _caller_subset(subset, str(self.path))
        return LeafSpec(
            path=self.path,
            split_part=self.split_part or split_part,
            where=str(self.path),
            subflavors={**(self.subflavors or {}), **(subflavors or {})},
            ratio=ratio,
            absolute=absolute,
            shuffle_over_epochs=combine_multipliers(multiplier, self.shuffle_over_epochs_multiplier),
            dataset_config=self.dataset_config,
            split_config=self.split_config,
        )

    def traverse(self, mds_path: Optional[AnyPath] = None, *, split_part: str,
                 _subflavors: Optional[Dict[str, Any]] = None) -> List[TraversedDatasetReference]:
        leaf = self._leaf(split_part, _subflavors, 1, None)
        return [TraversedDatasetReference(leaf.path, leaf.split_part, {}, leaf.subflavors)]

    def get_datasets(self, *, training: bool, split_part: str, worker_config: Any, subflavors: Optional[Dict[str, Any]] = None,
                     shuffle_over_epochs_multiplier: Optional[int] = 1, subset: Optional[Mapping] = None,
                     **kwargs: Any) -> LoadedDatasetList:
        _check_worker_config(worker_config)
        leaf = self._leaf(split_part, subflavors, shuffle_over_epochs_multiplier, subset)
        return loaded_list([leaf], "none", training, kwargs)


class _YamlMetadataset(DatasetLoaderInterface):
    """The ``splits`` of a metadataset file (or dict), flattened one split at a time by the parser."""

    _CLASS = ""

    def __init__(self, path: Any, splits: Dict[str, Any]) -> None:
        #: where the metadataset stands: its relative paths start from this file's folder
        self.path = _as_path(path)
        self.splits = splits
        #: the file (or dict) it was read from, for messages, where it is not ``path`` (set by load_dataset)
        self._label: Optional[str] = None
        #: the files being read, outermost first (a file including itself is refused)
        self._stack: Optional[tuple] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self._file()!r}, splits={sorted(self.splits)})"

    def _file(self) -> str:
        return self._label or str(self.path)

    def _flatten(self, split_part: str, ctx, check: bool = True) -> Flattened:
        data = {"__class__": self._CLASS, "splits": self.splits}
        stack = self._stack if self._stack is not None else (str(self.path.resolve()),)
        return parse(data, self._file(), self.path.parent, split_part, stack=stack, ctx=ctx, check=check)

    def post_initialize(self, mds_path: Optional[AnyPath] = None) -> None:
        """Parse every split: unknown keys, bad weights and missing paths raise here, before any loading."""
        if not isinstance(self.splits, dict):
            raise DatasetConfigError(f"{self._file()}: top level: a metadataset needs a 'splits' mapping")
        for name in self.splits:
            self._flatten(name, start_context(name))

    def traverse(self, mds_path: Optional[AnyPath] = None, *, split_part: str,
                 _subflavors: Optional[Dict[str, Any]] = None) -> List[TraversedDatasetReference]:
        """The leaves of ``split_part``; paths need not exist (a missing one is a leaf).

        Raises:
            NotImplementedError: the split holds a ``join`` (as Energon's traversal)."""
        flat = self._flatten(split_part, start_context(split_part, _subflavors), check=False)
        if any(getattr(leaf, "join", None) is not None for leaf in flat.leaves):
            raise NotImplementedError("traverse_metadataset() does not support joined datasets.")
        return [TraversedDatasetReference(leaf.path, leaf.split_part, dict(leaf.aux), leaf.subflavors) for leaf in flat.leaves]

    def get_datasets(self, *, training: bool, split_part: str, worker_config: Any, subflavors: Optional[Dict[str, Any]] = None,
                     shuffle_over_epochs_multiplier: Optional[int] = 1, subset: Optional[Mapping] = None,
                     **kwargs: Any) -> LoadedDatasetList:
        """Open every leaf of ``split_part``; ``subflavors`` override every level's, ``subset`` (a
        ratio range only: absolute ranges are for leaves) applies on top of the tree's."""
        _check_worker_config(worker_config)
        ratio, absolute = _caller_subset(subset, self._file())
        if absolute is not None:
            raise absolute_subset_error(self._file(), "get_datasets(subset=...)", absolute)
        flat = self._flatten(split_part, start_context(split_part, subflavors, ratio, shuffle_over_epochs_multiplier))
        return loaded_list(flat.leaves, flat.mode, training, kwargs)

    def prepare(self, split_part: Optional[str] = None) -> Sequence[AnyPath]:
        """Validate the split(s); there are no auxiliary caches to build, so nothing is written."""
        for name in [split_part] if split_part is not None else list(self.splits):
            self._flatten(name, start_context(name))
        return ()


class Metadataset(_YamlMetadataset):
    """A V1 metadataset (``splits: {train: {datasets: [{weight, path, subflavors}, ...]}}``)."""

    _CLASS = "Metadataset"


class MetadatasetV2(_YamlMetadataset):
    """A V2 metadataset (``__class__: MetadatasetV2``: ``path``/``blend``/``blend_epochized`` nodes, subsets)."""

    _CLASS = "MetadatasetV2"


def _is_prepared(path: AnyPath) -> bool:
    if str(path).endswith(".jsonl"):
        return path.is_file()
    meta = meta_dir(path)
    return (meta / INFO_JSON).is_file() or (meta / INFO_YAML).is_file()


def _metadataset(data: Any, file: str) -> type:
    """The class a parsed metadataset's ``__class__`` names."""
    if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
        raise DatasetConfigError(f"{file}: top level: a metadataset needs a 'splits' mapping")
    cls = data.get("__class__")
    if cls in (None, "Metadataset"):
        return Metadataset
    if cls == "MetadatasetV2":
        return MetadatasetV2
    raise DatasetConfigError(f"{file}: __class__: unknown metadataset class {cls!r} (MetadatasetV2 or Metadataset)")


def _yaml_metadataset(source: Any) -> "_YamlMetadataset":
    """The metadataset of a YAML file or a dict, standing where its top-level ``path:`` says, else
    where the file is (a dict: in the working directory)."""
    file = DICT_LABEL if isinstance(source, dict) else str(source)
    data = source if isinstance(source, dict) else read_file(source)
    cls = _metadataset(data, file)
    own = Path.cwd() / DICT_LABEL if isinstance(source, dict) else _as_path(source)
    located = stands_for(data, file)
    mds = cls(own if located is None else located, data["splits"])
    mds._label = DICT_LABEL if isinstance(source, dict) else str(own)
    mds._stack = () if isinstance(source, dict) else (str(own.resolve()),)
    return mds


def load_dataset(path: Any, **kwargs: Any) -> DatasetLoaderInterface:
    """A prepared dataset (a :class:`DatasetLoader`) or a metadataset YAML/dict (a
    :class:`MetadatasetV2` or V1 :class:`Metadataset`), validated.

    Args:
        path: a dataset folder, a ``.jsonl`` file, a ``.yaml``/``.yml`` metadataset, or a metadataset
            as a dict (its relative paths are relative to the working directory, unless its top-level
            ``path:`` names where it stands).
        **kwargs: for a dataset: :class:`DatasetLoader`'s arguments (``split_part``, ``subflavors``,
            ``dataset_config``, ``split_config``…); a metadataset takes none (``None`` values are ignored).

    Raises:
        DatasetConfigError: no dataset or metadataset at ``path``, or a bad metadataset (naming the file and node).
        TypeError: keyword arguments a metadataset does not take.
    """
    if isinstance(path, dict) or (str(path).endswith((".yaml", ".yml")) and _as_path(path).is_file()):
        extra = sorted(k for k, v in kwargs.items() if v is not None)
        if extra:
            raise TypeError(f"load_dataset: a metadataset takes no {extra} (set them on its references)")
        mds = _yaml_metadataset(path)
        mds.post_initialize()
        return mds
    if not _as_path(path).exists():
        raise DatasetConfigError(f"Invalid dataset at {path}: it does not exist")
    loader = DatasetLoader(path, **kwargs)
    loader.post_initialize()
    return loader


def traverse_metadataset(path: Any, *, split_part: str, **kwargs: Any) -> List[TraversedDatasetReference]:
    """The leaf references of one split of a metadataset YAML, nested files resolved, nothing opened.

    Each entry has the leaf's resolved ``path``, effective ``split_part``, resolved ``aux`` paths and
    the subflavors the metadataset levels give it (outer levels win; ``dataset.yaml``'s are not read).

    Raises:
        DatasetConfigError: ``path`` is not a metadataset YAML, or the tree is malformed.
        TypeError: a keyword argument (Energon hands them to the metadataset's constructor, which
            takes none that change a traversal; one that is not ``None`` was ignored silently).
    """
    extra = sorted(k for k, v in kwargs.items() if v is not None)
    if extra:
        raise TypeError(f"traverse_metadataset: a metadataset takes no {extra} (set them on its references)")
    if not (str(path).endswith((".yaml", ".yml")) and _as_path(path).is_file()):
        raise DatasetConfigError(f"traverse_metadataset only supports metadatasets (a .yaml file), got {path}")
    return _yaml_metadataset(path).traverse(split_part=split_part)


def prepare_metadataset(path: Any) -> None:
    """Energon writes the join index of each ``join`` node here. energon_ray joins by key without
    one, so it loads and validates the metadataset (every split, every referenced path) and writes nothing.

    Raises:
        DatasetConfigError: as :func:`load_dataset`.
    """
    mds = load_dataset(path)
    if not isinstance(mds, (Metadataset, MetadatasetV2)):
        raise DatasetConfigError(f"prepare_metadataset needs a metadataset YAML, got the dataset {path}")
    mds.prepare()
