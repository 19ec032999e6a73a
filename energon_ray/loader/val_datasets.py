"""``get_val_datasets``: one validation dataset per leaf of a (meta)dataset, as Energon's."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from energon_ray.blend.loaded import LeafDataset
from energon_ray.blend.metadataset import Flattened
from energon_ray.blend.metadataset_api import load_dataset
from energon_ray.loader.dataset import EnergonDataset
from energon_ray.loader.factory import _UNSET, _pop_subflavors, get_val_dataset, val_limit
from energon_ray.task_encoder.base import TaskEncoder
from energon_ray.worker import WorkerConfig


def get_val_datasets(
    path: Any,
    *,
    split_part: str = "val",
    worker_config: Optional[WorkerConfig] = None,
    batch_size: Optional[int] = _UNSET,
    batch_drop_last: bool = False,
    packing_buffer_size: Optional[int] = None,
    limit: Optional[int] = None,
    task_encoder: Optional[TaskEncoder] = None,
    trust_dataset_code: Optional[bool] = None,
    **kwargs: Any,
) -> List[Tuple[EnergonDataset, LeafDataset]]:
    """Each leaf of ``path`` as its own validation dataset, with the leaf it reads.

    Where ``get_val_dataset`` concatenates a metadataset's leaves into one pass (batches running
    across from one into the next), this gives one pass per leaf, so each can be evaluated on its
    own; a leaf's dataset yields exactly what ``get_val_dataset`` on that leaf alone would (its
    subflavors, split part and subsets from the tree, ``limit`` batches per leaf). Weights and
    repetitions do not apply to validation.

    Args:
        path: a prepared dataset folder, a ``.jsonl`` file, or a metadataset YAML/dict.
        split_part, worker_config, batch_size, batch_drop_last, packing_buffer_size, limit,
            task_encoder, trust_dataset_code: as in ``get_val_dataset`` (``batch_size`` is required).
        **kwargs: as in ``get_val_dataset``; ``subflavors`` override every level's, ``dataset_config``
            and ``split_config`` apply to a dataset folder.

    Returns:
        ``[(dataset, leaf), ...]`` in the metadataset's order: ``dataset`` for ``get_loader``, ``leaf``
        a :class:`~energon_ray.blend.loaded.LeafDataset` (``.path``, ``.split_part``, ``.subflavors``, ``len()``).

    Raises:
        TypeError: no ``batch_size``.
        DatasetConfigError: as ``get_val_dataset``.
    """
    if batch_size is _UNSET:
        raise TypeError("get_val_datasets() needs batch_size= (an int, or None for no batching)")
    limit = val_limit(limit)  # refused before the metadataset is read
    loader_kwargs = {k: kwargs.pop(k) for k in ("dataset_config", "split_config") if k in kwargs}
    loaded = load_dataset(path, **loader_kwargs).get_datasets(
        training=False, split_part=split_part, worker_config=worker_config, subflavors=_pop_subflavors(kwargs),
        trust_dataset_code=trust_dataset_code,
    )  # fmt: skip
    out = []
    for entry in loaded.datasets:
        leaf = entry.dataset
        dataset = get_val_dataset(
            Flattened(leaves=[leaf.spec], mode="none"), split_part=leaf.split_part, worker_config=worker_config,
            batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, limit=limit,
            task_encoder=task_encoder, trust_dataset_code=trust_dataset_code, **kwargs,
        )  # fmt: skip
        out.append((dataset, leaf))
    return out
