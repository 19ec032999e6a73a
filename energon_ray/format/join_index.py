"""The join table of a ``join:`` metadataset: which sample of every joined dataset makes each joined row.

Built from each dataset's ``.nv-meta/index.sqlite`` (sample key → shard and index in shard): the
rows follow the primary's split part (shards in split order, samples in shard order), without its
excluded samples; a secondary's sample with the same key fills its column. A secondary without
that key fills ``-1`` (``nonmatch: none``), drops the row (``skip``) or stops with an error (``error``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from energon_ray.errors import DatasetConfigError
from energon_ray.format.indexer import open_index_readonly
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.info import read_info
from energon_ray.storage import RemotePath, as_path
from energon_ray.storage.cache import local_file_copy

#: Column value of a secondary that has no sample for the row (``nonmatch: none``).
MISSING = -1


def _sample_rows(dataset: PreparedDataset) -> List[Tuple[int, str]]:
    """``(global index in the split part, sample key)`` of every not excluded sample, in split order."""
    root = as_path(dataset.root)
    file = root / ".nv-meta" / "index.sqlite"
    if not file.is_file():
        raise DatasetConfigError(
            f"{dataset.root}: no .nv-meta/index.sqlite, which a join needs to match samples by key; "
            f"run `energon-ray prepare {dataset.root}` (or `energon prepare`)"
        )
    info_names = list(read_info(root))
    position = {s.name: i for i, s in enumerate(dataset.shards)}
    # tar_file_id numbers the shards of .info in order; only this split part's shards count
    shard_of_id = {i: position[name] for i, name in enumerate(info_names) if name in position}
    starts = dataset.shard_starts
    local = Path(local_file_copy(file)) if isinstance(file, RemotePath) else file  # once per node
    db = open_index_readonly(local)
    try:
        rows = db.execute("SELECT tar_file_id, sample_index, sample_key FROM samples").fetchall()
    finally:
        db.close()
    excluded = set(int(i) for i in dataset.excluded_indices()) if dataset.sample_excludes else set()
    out = []
    for tar_id, index, key in rows:
        shard = shard_of_id.get(int(tar_id))
        if shard is None:
            continue
        _check_index(file, dataset, shard, int(index), str(key))
        gindex = int(starts[shard]) + int(index)
        if gindex not in excluded:
            out.append((gindex, str(key)))
    out.sort()
    return out


def _check_index(file, dataset: PreparedDataset, shard: int, index: int, key: str) -> None:
    """A sample's index in its shard, as ``index.sqlite`` gives it, must be one of the shard's samples:
    past its end it would name a sample of the next shard, or none at all (a failure deep in a Ray task)."""
    info = dataset.shards[shard]
    if not 0 <= index < info.count:
        raise DatasetConfigError(
            f"{file}: sample key {key!r} is at index {index} of {info.name}, which holds {info.count} samples "
            f"(.nv-meta/.info.json): the index is stale or corrupt; run `energon-ray prepare --tar-index-only "
            f"{dataset.root}` to rebuild it"
        )


def build_join_table(datasets: Sequence[PreparedDataset], nonmatch: Sequence[str], where: str) -> np.ndarray:
    """The ``(rows, len(datasets))`` table of sample indices (global in each split part) of a join.

    Args:
        datasets: the joined datasets, primary first.
        nonmatch: per dataset ``error``, ``skip`` or ``none`` (the primary's is ``error``).
        where: the metadataset file and node, for messages.

    Raises:
        DatasetConfigError: a secondary with ``nonmatch: error`` lacks a primary's key (naming the key
            and both datasets), or a dataset has no ``index.sqlite``.
    """
    primary = _sample_rows(datasets[0])
    lookups: List[Dict[str, int]] = [{key: gindex for gindex, key in _sample_rows(ds)} for ds in datasets[1:]]
    table = np.empty((len(primary), len(datasets)), dtype=np.int64)
    n = 0
    for gindex, key in primary:
        row = [gindex]
        for d, lookup in enumerate(lookups, start=1):
            hit = lookup.get(key)
            if hit is None:
                if nonmatch[d] == "skip":
                    break
                if nonmatch[d] == "error":
                    raise DatasetConfigError(
                        f"{where}: join: sample key {key!r} of the primary dataset {datasets[0].root} is missing from "
                        f"joined dataset #{d} {datasets[d].root} (split part {datasets[d].split_part!r}); "
                        "set nonmatch: skip or nonmatch: none on that dataset to allow it"
                    )
                hit = MISSING
            row.append(hit)
        else:
            table[n] = row
            n += 1
    return table[:n].copy()
