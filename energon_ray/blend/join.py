"""The ``join:`` node of a ``MetadatasetV2``: several prepared datasets read side by side, their
samples matched by sample key and merged into one sample by a ``joiner``.

``join`` is a list (the joiner gets the samples positionally) or a mapping (by name) of dataset
references; each may set ``path``, ``split_part``, ``subflavors``, ``dataset_config``,
``split_config`` and ``nonmatch`` (``error``, the default, ``skip`` or ``none``). The first dataset
is the primary: the joined samples follow its order, and it must keep ``nonmatch: error``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional

from energon_ray.errors import DatasetConfigError
from energon_ray.storage import RemotePath

NONMATCH = ("error", "skip", "none")
_MEMBER_KEYS = {"path", "split_part", "subflavors", "nonmatch", "dataset_config", "split_config",
                "shuffle_over_epochs_multiplier"}  # fmt: skip


@dataclasses.dataclass
class JoinMember:
    """One dataset of a join, resolved against the metadataset's folder."""

    path: Path | RemotePath
    split_part: str
    subflavors: Dict[str, Any]
    nonmatch: str = "error"
    dataset_config: Optional[str] = None
    split_config: Optional[str] = None


@dataclasses.dataclass
class JoinSpec:
    """The datasets of a ``join:`` node (primary first), their names (mapping form) and the joiner."""

    members: List[JoinMember]
    #: the mapping's names in order (``None``: list form, samples passed positionally)
    names: Optional[List[str]]
    #: the ``joiner:`` value as written (a ``{__module__, __class__}`` mapping, a name, or a callable)
    joiner: Any
    file: str
    where: str


def parse_join(node: dict, parser: Any, where: str, ctx: Any) -> JoinSpec:
    """The :class:`JoinSpec` of a ``join:`` node (``parser``: the metadataset parser, ``ctx`` its context).

    Raises:
        DatasetConfigError: naming the file and node: no joiner, an empty join, a member that is not a
            prepared dataset folder, an unknown key or ``nonmatch`` value, a primary that is not ``error``.
    """
    file = parser.file
    entries = node["join"]
    if isinstance(entries, dict):
        names: Optional[List[str]] = [str(k) for k in entries]
        items = list(entries.values())
    elif isinstance(entries, list):
        names, items = None, list(entries)
    else:
        raise DatasetConfigError(f"{file}: {where}.join: must be a list or a mapping of datasets, got {entries!r}")
    if len(items) < 1:
        raise DatasetConfigError(f"{file}: {where}.join: needs at least one dataset")
    if node.get("joiner") is None:
        raise DatasetConfigError(f"{file}: {where}: a 'join' needs a 'joiner' (a sample type or a function)")
    for key in ("dataset_config", "split_config"):
        if node.get(key) is not None:
            raise DatasetConfigError(f"{file}: {where}: cannot set {key!r} on a join (set it on its datasets)")
    members = []
    for i, item in enumerate(items):
        sub = f"{where}.join[{names[i] if names else i}]"
        members.append(_member(item, parser, sub, ctx))
    if members[0].nonmatch != "error":
        raise DatasetConfigError(
            f"{file}: {where}.join: the primary (first) dataset must keep nonmatch 'error', got {members[0].nonmatch!r}"
        )
    return JoinSpec(members=members, names=names, joiner=node["joiner"], file=file, where=where)


def _member(item: Any, parser: Any, where: str, ctx: Any) -> JoinMember:
    file = parser.file
    if not isinstance(item, dict) or "path" not in item:
        raise DatasetConfigError(f"{file}: {where}: a joined dataset must be a mapping with a 'path', got {item!r}")
    unknown = set(item) - _MEMBER_KEYS
    if unknown:
        raise DatasetConfigError(f"{file}: {where}: unknown keys {sorted(unknown)} for a joined dataset")
    nonmatch = item.get("nonmatch", "error")
    if nonmatch not in NONMATCH:
        raise DatasetConfigError(f"{file}: {where}: nonmatch must be one of {list(NONMATCH)}, got {nonmatch!r}")
    path = parser.resolve(item["path"], where)
    if parser.check and not path.exists():
        raise DatasetConfigError(f"{file}: {where}: path {str(item['path'])!r} does not exist ({path})")
    if path.suffix in (".yaml", ".yml"):
        raise DatasetConfigError(f"{file}: {where}: only prepared dataset folders can be joined, not metadataset {path}")
    return JoinMember(
        path=path,
        split_part=item.get("split_part") or ctx.split_part,
        # dataset.yaml < this reference < the join and the levels above (outer wins, as in Energon)
        subflavors={**dict(item.get("subflavors") or {}), **ctx.subflavors},
        nonmatch=nonmatch,
        dataset_config=item.get("dataset_config"),
        split_config=item.get("split_config"),
    )
