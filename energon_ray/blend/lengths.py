"""Per-worker lengths of compositions, counted the way Energon's ``len_worker`` counts them.

Energon's ``len(dataset)`` is the sum over the rank's workers of each worker's length, and every
wrapper computes its worker length from its inner datasets' worker lengths. Batching happens per
worker, so where samples of several sources are pooled before batching (a metadataset's train blend)
the batches are counted on the pooled samples of each worker, not summed per source: two sources of
55 samples with ``batch_size=10`` make 11 batches, not 6 + 6.

Example:
    >>> split_evenly(10, 3)
    [4, 3, 3]
    >>> batch_count(25, 10, drop_last=False), batch_count(25, 10, drop_last=True)
    (3, 2)
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence


def split_evenly(total: int, workers: int) -> List[int]:
    """``total`` items over ``workers`` workers, the first ones taking the remainder (Energon's split)."""
    workers = max(1, workers)
    return [total // workers + (1 if w < total % workers else 0) for w in range(workers)]


def batch_count(samples: int, batch_size: Optional[int], drop_last: bool) -> int:
    """Batches made of ``samples`` samples (``batch_size=None``: no batching, one item per sample)."""
    if batch_size is None:
        return samples
    return samples // batch_size if drop_last else -(-samples // batch_size)


def add_per_worker(lengths: Sequence[Sequence[int]]) -> List[int]:
    """Element-wise sum of several per-worker length lists (one list per source)."""
    return [sum(column) for column in zip(*lengths)]


def worker_items(dataset: Any) -> List[int]:
    """Items per local worker and pass of any composition or ``EnergonDataset``.

    Compositions answer with their own ``worker_items()``; an ``EnergonDataset`` gives its batches per
    worker (capped by ``limit``; a ``virtual_epoch_length`` is split over the workers as Energon's
    ``EpochizeDataset`` splits it).
    """
    own = getattr(dataset, "worker_items", None)
    if own is not None:
        return list(own())
    options = getattr(dataset, "options", None)
    if options is not None and hasattr(dataset, "worker_batches"):
        if options.virtual_epoch_length:
            return split_evenly(options.virtual_epoch_length, len(dataset.worker_batches()))
        batches = dataset.worker_batches()
        caps = dataset.worker_caps()
        return batches if caps is None else [min(b, c) for b, c in zip(batches, caps)]
    return split_evenly(len(dataset), dataset.num_workers)


def worker_samples(dataset: Any) -> List[int]:
    """Samples (before batching) per local worker of an ``EnergonDataset``, after repetitions.

    Raises:
        TypeError: for a composition, whose items are no longer samples.
    """
    lengths = getattr(dataset, "worker_lengths", None)
    if lengths is None:
        raise TypeError(f"{dataset!r} is not a dataset from get_train_dataset/get_val_dataset; its samples cannot be pooled")
    return list(lengths())
