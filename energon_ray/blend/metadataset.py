"""Metadataset YAML (``MetadatasetV2`` and V1 files): a tree of references, blends and subsets,
flattened to leaf datasets with effective weights, repetitions, subflavors and subsets.

Rules (Energon's): nested blend weights multiply (each level normalised); subflavors merge
dataset.yaml < inner < outer (outer wins); a reference's own ``split_part`` wins over the one
passed down; ratio subsets compose inner-first, absolute subsets only at leaves;
``shuffle_over_epochs_multiplier`` multiplies (``None`` anywhere → no shuffle, -1 → with replacement).
Weights and repetitions are multiplied innermost level first, in Energon's order, so the floats are
Energon's to the last bit. Paths may be ``s3://``/``msc://`` URLs; a relative path in a remote YAML
is relative to its folder there. A ``join:`` node is one leaf (its primary's path) carrying its
:class:`~energon_ray.blend.join.JoinSpec`. The Python objects over this parser (``load_dataset``,
``MetadatasetV2``…) live in :mod:`energon_ray.blend.metadataset_api`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from energon_ray.blend.metadataset_values import (
    MULTIPLIER_VALUES, absolute_subset_error, combine_multipliers, compose_ratio, config_number, is_multiplier, node_error, parse_subset,
)  # fmt: skip
from energon_ray.errors import DatasetConfigError, first_time, users_stacklevel
from energon_ray.format import energon_yaml
from energon_ray.storage import RemotePath, StorageError, as_path, is_remote, local_of

_REF_KEYS = {"path", "split_part", "subflavors", "subflavor", "subset", "shuffle_over_epochs_multiplier",
             "dataset_config", "split_config", "weight", "repetitions", "aux"}  # fmt: skip
_NODE_KEYS = _REF_KEYS | {"blend", "blend_epochized", "join", "joiner"}
_TOP_KEYS = {"__module__", "__class__", "splits", "path"}
#: keys that only a reference to a prepared dataset reads (anywhere else they would do nothing)
_DATASET_ONLY = ("dataset_config", "split_config", "aux")
#: ``errors.first_time`` kind of a reference's deprecated ``subflavor:`` (keyed by ``(file, node)``)
SUBFLAVOR = "metadataset subflavor"
_URL = re.compile(r"^(?P<protocol>[a-z][a-z0-9+.-]*)://(?P<rest>.*)", re.IGNORECASE)


@dataclasses.dataclass
class LeafSpec:
    """One prepared dataset the metadataset reads, with everything the tree said about it."""

    path: Path | RemotePath
    split_part: str
    where: str
    weight: float = 1.0
    repetitions: Optional[float] = None
    subflavors: Dict[str, Any] = dataclasses.field(default_factory=dict)
    ratio: Optional[Tuple[float, float]] = None
    absolute: Optional[Tuple[int, Optional[int]]] = None
    shuffle_over_epochs: Optional[int] = 1
    dataset_config: Optional[str] = None
    split_config: Optional[str] = None
    #: ``aux:`` references, resolved to paths (the cookers' file stores, see ``energon_ray.cache.aux``).
    aux: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the ``aux:`` names written ``filesystem://…``: a folder's files by path, even a prepared one's.
    filesystem_aux: Tuple[str, ...] = ()
    #: a ``join:`` node (:class:`energon_ray.blend.join.JoinSpec`; ``path`` is then its primary's).
    join: Optional[Any] = None


@dataclasses.dataclass
class Flattened:
    """The leaves of one split and how they are combined (``none``, ``blend`` or ``blend_epochized``)."""

    leaves: List[LeafSpec]
    mode: str


def is_metadataset_path(path: Any) -> bool:
    """A ``.yaml``/``.yml`` file, a dict or a :class:`Flattened` is a metadataset; a folder is a prepared dataset."""
    if isinstance(path, (dict, Flattened)):
        return True
    p = _as_path(path)
    return p.suffix in (".yaml", ".yml") and p.is_file()


@dataclasses.dataclass
class _Ctx:
    """What flows down the tree from outer to inner nodes."""

    split_part: str
    subflavors: Dict[str, Any] = dataclasses.field(default_factory=dict)
    ratio: Optional[Tuple[float, float]] = None
    shuffle_over_epochs: Optional[int] = 1


def start_context(split_part: str, subflavors: Optional[Dict[str, Any]] = None, ratio: Optional[Tuple[float, float]] = None,
                  shuffle_over_epochs: Optional[int] = 1) -> _Ctx:
    """What the caller of a metadataset passes down to its root (``get_datasets``' arguments)."""
    return _Ctx(split_part=split_part, subflavors=dict(subflavors or {}), ratio=ratio, shuffle_over_epochs=shuffle_over_epochs)


def _as_path(value: Any) -> Path | RemotePath:
    """A YAML's or a caller's path; a local one made absolute and free of ``.``/``..`` (as Energon's
    paths are: ``sub/../a`` in a YAML is ``<folder>/a``; symlinks are kept)."""
    path = value if isinstance(value, RemotePath) else as_path(str(value))
    return path if isinstance(path, RemotePath) else Path(os.path.abspath(path))


class _Parser:
    def __init__(self, file: str, base: Path | RemotePath, stack: Tuple[str, ...], check: bool = True):
        self.file = file
        self.base = base
        self.stack = stack
        #: False: a missing path is a leaf (traversal), not an error
        self.check = check
        self.modes: set = set()

    def node(self, node: Any, where: str, ctx: _Ctx, entry_of: Optional[str] = None) -> List[LeafSpec]:
        """The leaves under ``node``; ``entry_of`` is the list it is an entry of (``blend``,
        ``blend_epochized``) or ``None``."""
        if not isinstance(node, dict):
            raise node_error(self.file, where, f"expected a mapping (path/blend/blend_epochized), got {node!r}")
        unknown = set(node) - _NODE_KEYS
        if unknown:
            raise node_error(self.file, where, f"unknown keys {sorted(unknown)}")
        self._refuse_ignored_keys(node, where, entry_of)
        if "join" in node:
            return self.join(node, where, ctx)
        kinds = [k for k in ("path", "blend", "blend_epochized") if k in node]
        if len(kinds) != 1:
            raise node_error(self.file, where, f"a node needs exactly one of path, blend, blend_epochized; got {kinds or 'none'}")
        ctx = self._descend(node, where, ctx)
        if kinds[0] == "path":
            return self.reference(node, where, ctx)
        return self.blend(node, kinds[0], where, ctx)

    def _refuse_ignored_keys(self, node: dict, where: str, entry_of: Optional[str]) -> None:
        """Refuse a key this node has no use for: it would be read nowhere, so a ``weight`` in a
        ``blend_epochized`` entry or a ``dataset_config`` on a blend would silently do nothing
        (Energon's schema refuses them too)."""
        if "weight" in node and entry_of != "blend":
            raise node_error(self.file, where, f"'weight' ({node['weight']!r}) only applies to an entry of a 'blend' list; here it would be ignored")
        if "repetitions" in node and entry_of != "blend_epochized":
            raise node_error(self.file, where, f"'repetitions' ({node['repetitions']!r}) only applies to an entry of a 'blend_epochized' list; here it would be ignored")
        if "joiner" in node and "join" not in node:
            raise node_error(self.file, where, "'joiner' only applies to a 'join' node; here it would be ignored")
        dataset_only = [k for k in _DATASET_ONLY if k in node]
        if "join" in node:  # parse_join names dataset_config and split_config on a join itself
            dataset_only = [k for k in dataset_only if k == "aux"]
        if dataset_only and "path" not in node:
            raise node_error(self.file, where, f"{dataset_only} only apply to a 'path' to a prepared dataset; here they would be ignored")

    def _descend(self, node: dict, where: str, ctx: _Ctx) -> _Ctx:
        subflavors = node.get("subflavors") or {}
        if not isinstance(subflavors, dict):
            raise node_error(self.file, where, f"subflavors must be a mapping of names to values, got {subflavors!r}")
        subflavors = dict(subflavors)
        if "subflavor" in node:
            subflavors.setdefault("__subflavor__", node["subflavor"])
            _warn_subflavor(self.file, where, node["subflavor"])
        ratio, absolute = parse_subset(node, self.file, where)
        if absolute is not None and "path" not in node and "join" not in node:  # a join is a leaf too, as in Energon
            raise absolute_subset_error(self.file, where, absolute)
        mult = node.get("shuffle_over_epochs_multiplier", 1)
        if not is_multiplier(mult):
            raise node_error(self.file, where, f"shuffle_over_epochs_multiplier must be {MULTIPLIER_VALUES}, got {mult!r}")
        return dataclasses.replace(
            ctx,
            split_part=node.get("split_part") or ctx.split_part,
            subflavors={**subflavors, **ctx.subflavors},
            ratio=compose_ratio(ratio, ctx.ratio),
            shuffle_over_epochs=combine_multipliers(ctx.shuffle_over_epochs, mult),
        )

    def join(self, node: dict, where: str, ctx: _Ctx) -> List[LeafSpec]:
        from energon_ray.blend.join import parse_join

        if any(k in node for k in ("path", "blend", "blend_epochized")):
            raise node_error(self.file, where, "a 'join' node cannot also have path, blend or blend_epochized")
        # the join's own shuffle_over_epochs_multiplier is checked but not applied: Energon's join
        # shuffles by its caller's, so applying it gave other batches than Energon's
        ctx = dataclasses.replace(self._descend(node, where, ctx), shuffle_over_epochs=ctx.shuffle_over_epochs)
        spec = parse_join(node, self, where, ctx)
        primary = spec.members[0]
        _, absolute = parse_subset(node, self.file, where)  # of the joined rows
        return [
            LeafSpec(path=primary.path, split_part=primary.split_part, where=f"{self.file}: {where}",
                     subflavors=dict(ctx.subflavors), ratio=ctx.ratio, absolute=absolute,
                     shuffle_over_epochs=ctx.shuffle_over_epochs, join=spec)
        ]  # fmt: skip

    def resolve(self, raw: Any, where: str) -> Path | RemotePath:
        """A path of the YAML (at node ``where``), relative to its folder unless absolute.

        Raises:
            DatasetConfigError: a URL that is none (``s3:///key``), an ``msc://`` profile no MSC config
                defines, or a relative path that leads above the bucket or profile of a YAML in an object
                store; naming the file and the node.
        """
        raw = str(raw)
        absolute = is_remote(raw) or local_of(raw) is not None or Path(raw).is_absolute()
        try:
            return _as_path(raw if absolute else self.base / raw)
        except (ValueError, StorageError) as exc:
            raise node_error(self.file, where, f"path {raw!r}: {exc}") from None

    def blend(self, node: dict, kind: str, where: str, ctx: _Ctx) -> List[LeafSpec]:
        entries = node[kind]
        if not isinstance(entries, list) or not entries:
            raise node_error(self.file, f"{where}.{kind}", "must be a non-empty list")
        self.modes.add(kind)
        if len(self.modes) > 1:
            raise node_error(self.file, f"{where}.{kind}", "cannot combine 'blend' and 'blend_epochized' in one metadataset")
        out = []
        if kind == "blend":
            weights = [config_number(e.get("weight", 1.0) if isinstance(e, dict) else 1.0, self.file, f"{where}.blend[{i}]", "weight") for i, e in enumerate(entries)]
            total = sum(weights)
            if math.isinf(total):  # each weight / inf is 0: "all zero" further on, naming no file
                raise node_error(self.file, f"{where}.blend", f"weights {weights} sum to {total} (too large for a float); scale them down")
            if total <= 0:
                raise node_error(self.file, f"{where}.blend", f"weights {weights} are all zero")
            for i, (entry, w) in enumerate(zip(entries, weights)):
                for leaf in self.node(entry, f"{where}.blend[{i}]", ctx, entry_of="blend"):
                    out.append(dataclasses.replace(leaf, weight=leaf.weight * w / total))
        else:
            for i, entry in enumerate(entries):
                sub = f"{where}.blend_epochized[{i}]"
                reps = config_number(entry.get("repetitions", 1) if isinstance(entry, dict) else 1, self.file, sub, "repetitions", allow_zero=False)
                for leaf in self.node(entry, sub, ctx, entry_of="blend_epochized"):
                    out.append(dataclasses.replace(leaf, repetitions=reps * (1 if leaf.repetitions is None else leaf.repetitions)))
        return out

    def reference(self, node: dict, where: str, ctx: _Ctx) -> List[LeafSpec]:
        raw = node["path"]
        path = self.resolve(raw, where)
        if self.check and not path.exists():
            raise node_error(self.file, where, f"path {str(raw)!r} does not exist ({path})")
        _, absolute = parse_subset(node, self.file, where)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            if absolute is not None:
                raise absolute_subset_error(self.file, where, absolute)
            dataset_only = [k for k in _DATASET_ONLY if k in node]
            if dataset_only:  # the inner file's own leaves name their configs; these would be ignored
                raise node_error(self.file, where, f"{dataset_only} cannot be set on a reference to a metadataset ({path.name}); set them on its datasets")
            if str(path.resolve()) in self.stack:
                raise node_error(self.file, where, f"metadataset {path} includes itself")
            inner = parse_file(path, ctx.split_part, stack=self.stack, ctx=ctx, check=self.check)
            self.modes |= {inner.mode} - {"none"}
            if len(self.modes) > 1:
                raise node_error(self.file, where, "cannot combine 'blend' and 'blend_epochized' in one metadataset")
            return inner.leaves
        return [
            LeafSpec(
                path=path,
                split_part=ctx.split_part,
                where=f"{self.file}: {where}",
                subflavors=dict(ctx.subflavors),
                ratio=ctx.ratio,
                absolute=absolute,
                shuffle_over_epochs=ctx.shuffle_over_epochs,
                dataset_config=node.get("dataset_config"),
                split_config=node.get("split_config"),
                aux=self.aux(node.get("aux"), where),
                filesystem_aux=_filesystem_names(node.get("aux")),
            )
        ]

    def aux(self, refs: Any, where: str) -> Dict[str, Any]:
        """``aux:`` names → paths: ``filesystem://p`` (relative to the YAML's folder unless absolute),
        ``filesystem+s3://p`` (the URL ``s3://p``), other URLs as they are, plain paths relative."""
        if refs is None:
            return {}
        if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
            raise node_error(self.file, f"{where}.aux", f"aux must map names to path strings, got {refs!r}")
        out = {}
        for name, ref in refs.items():
            url = _URL.match(ref)
            protocol = url.group("protocol") if url else None
            if protocol == "filesystem":
                ref = url.group("rest")
            elif protocol is not None and protocol.startswith("filesystem+"):
                ref = f"{protocol[len('filesystem+'):]}://{url.group('rest')}"
            out[name] = self.resolve(ref, f"{where}.aux.{name}")
        return out


def _warn_subflavor(file: str, where: str, value: Any) -> None:
    """Energon's deprecation of a reference's ``subflavor:`` (a ``FutureWarning``), once per node and
    process; metadatasets are read where the loader is built, never in Ray workers."""
    if not first_time(SUBFLAVOR, (file, where)):
        return
    warnings.warn(
        f"{file}: {where}: subflavor is deprecated (as in megatron-energon), use subflavors instead: "
        f"`subflavors: {{__subflavor__: {value!r}}}` gives the samples the same __subflavors__",
        FutureWarning,
        stacklevel=users_stacklevel(),  # the user's call, whatever energon_ray calls lie between
    )


def _filesystem_names(refs: Any) -> Tuple[str, ...]:
    """The ``aux:`` names given as ``filesystem://p`` or ``filesystem+s3://p`` (checked by ``aux``)."""
    return tuple(
        name for name, ref in (refs or {}).items()
        if (url := _URL.match(ref)) and url.group("protocol").split("+")[0] == "filesystem"
    )  # fmt: skip


def _v1_to_v2(data: dict, file: str) -> dict:
    splits = {}
    for name, split in (data.get("splits") or {}).items():
        datasets = split.get("datasets") if isinstance(split, dict) else None  # a list here gave AttributeError
        if not isinstance(datasets, list) or not datasets:
            raise node_error(file, f"splits.{name}", f"a V1 split needs a mapping with a non-empty 'datasets' list, got {split!r}")
        splits[name] = {"blend": datasets}
    return {"splits": splits}


def parse(data: Any, file: str, base: Path | RemotePath, split_part: str, *, stack: Tuple[str, ...] = (),
          ctx: Optional[_Ctx] = None, check: bool = True) -> Flattened:
    """Flatten the node of ``split_part`` of a parsed metadataset (``check=False``: missing paths are leaves)."""
    if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
        raise node_error(file, "top level", "a metadataset needs a 'splits' mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:  # Energon refuses them too ("Unexpected arguments"): a misspelled key did nothing
        raise node_error(file, "top level", f"unknown keys {sorted(map(str, unknown))}; a metadataset has {sorted(_TOP_KEYS)}")
    located = stands_for(data, file)
    cls = data.get("__class__")
    if cls in (None, "Metadataset"):
        data = _v1_to_v2(data, file)
    elif cls != "MetadatasetV2":
        raise node_error(file, "__class__", f"unknown metadataset class {cls!r} (MetadatasetV2 or Metadataset)")
    splits = data["splits"]
    if split_part not in splits:
        raise node_error(file, "splits", f"unknown split part {split_part!r}; the file defines {sorted(splits)}")
    parser = _Parser(file, base if located is None else located.parent, stack, check)
    ctx = ctx or _Ctx(split_part=split_part)
    leaves = parser.node(splits[split_part], f"splits.{split_part}", dataclasses.replace(ctx, split_part=split_part))
    mode = next(iter(parser.modes), "none")
    return Flattened(leaves=leaves, mode=mode)


def stands_for(data: dict, file: str) -> Optional[Path | RemotePath]:
    """Where a metadataset says it lives: its top-level ``path:`` (a relative one from the working
    directory), as Energon's ``path`` field, which overrides the file's own location; ``None``
    without one. Its relative paths then start from that file's folder.

    Raises:
        DatasetConfigError: a ``path:`` that is not a non-empty string.
    """
    if "path" not in data:
        return None
    raw = data["path"]
    if not isinstance(raw, str) or not raw.strip():
        raise node_error(file, "path", f"a metadataset's top-level path is the file it stands for (its relative paths start from that file's folder), a string; got {raw!r}")
    return _as_path(raw)


def read_file(path: Path | str | RemotePath) -> Any:
    """The parsed YAML of a metadataset file (local or remote)."""
    path = _as_path(path)
    try:
        return energon_yaml.load(path.read_text())
    except Exception as exc:
        raise DatasetConfigError(f"{path}: cannot parse metadataset: {exc}") from None


def parse_file(path: Path | str | RemotePath, split_part: str, *, stack: Tuple[str, ...] = (), ctx: Optional[_Ctx] = None,
               check: bool = True) -> Flattened:
    """Read and flatten a metadataset YAML file (local or remote)."""
    path = _as_path(path)
    data = read_file(path)
    return parse(data, str(path), path.parent, split_part, stack=stack + (str(path.resolve()),), ctx=ctx, check=check)
