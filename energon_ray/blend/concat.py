"""Concatenations: ``ConcatDataset`` (datasets one after another), ``MixBatchDataset`` (a blend's
items grouped into batches by a ``batch_mix_fn``) and the ``batch_mix_fn``s that concatenate
already-batched items into one batch."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Tuple

import torch

from energon_ray.blend.base import Composition, ListNode, OfSeveral, PassContext, Provider, check_same_workers
from energon_ray.blend.compose import BlendDataset
from energon_ray.blend.lengths import add_per_worker, batch_count, worker_items, worker_samples
from energon_ray.loader.merge import EXHAUSTED


def concat_pad(batch: List[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors along dim 0, zero-padding every other dimension to the largest.

    Example:
        >>> concat_pad([torch.ones(1, 2), torch.ones(2, 3)]).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    first = batch[0]
    if all(t.shape[1:] == first.shape[1:] for t in batch):
        return torch.cat(batch, dim=0)
    tail = [max(t.shape[d] for t in batch) for d in range(1, first.ndim)]
    out = first.new_zeros((sum(t.shape[0] for t in batch), *tail))
    row = 0
    for t in batch:
        out[(slice(row, row + t.shape[0]), *(slice(0, s) for s in t.shape[1:]))] = t
        row += t.shape[0]
    return out


def generic_concat(batch: List[Any]) -> Any:
    """Concatenate batched values: tensors with ``concat_pad``, lists and tuples flattened one level,
    dicts/dataclasses/NamedTuples field by field, other values listed.

    Example:
        >>> generic_concat([{"k": ["a"], "x": torch.zeros(1, 2)}, {"k": ["b"], "x": torch.ones(1, 2)}])["k"]
        ['a', 'b']
    """
    first = batch[0]
    if isinstance(first, torch.Tensor):
        return concat_pad(batch)
    if isinstance(first, dict):
        return {key: generic_concat([b[key] for b in batch]) for key in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        fields = [f.name for f in dataclasses.fields(first) if f.init]
        return type(first)(**{name: generic_concat([getattr(b, name) for b in batch]) for name in fields})
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(**{name: generic_concat([getattr(b, name) for b in batch]) for name in first._fields})
    if isinstance(first, list):
        return [x for b in batch for x in b]
    if isinstance(first, tuple):
        return tuple(x for b in batch for x in b)
    if first is None and all(b is None for b in batch):
        return None
    return list(batch)


def homogeneous_concat_mix(batches: List[Any]) -> Any:
    """Mix batches of one type into one batch with ``generic_concat`` (keys stay a flat list).

    Raises:
        TypeError: if the batches are of different types (write a ``batch_mix_fn`` for that).
    """
    kinds = {type(b) for b in batches}
    if len(kinds) != 1:
        raise TypeError(
            f"homogeneous_concat_mix got batches of several types {sorted(k.__name__ for k in kinds)}; "
            "pass a batch_mix_fn that combines them"
        )
    return generic_concat(batches)


class ConcatDataset(OfSeveral):
    """Sources one after another (per worker stream), no randomness: for validation.

    Args:
        *datasets: the datasets, in order.
        worker_config: accepted for Energon compatibility; must match the datasets'.
        limit: at most this many items per rank and pass.
    """

    def __init__(self, *datasets: Composition, worker_config: Any = None, limit: Optional[int] = None):
        self.worker_config = check_same_workers(list(datasets), "ConcatDataset")
        if worker_config is not None and worker_config != self.worker_config:
            raise ValueError("ConcatDataset: worker_config differs from the datasets' WorkerConfig")
        self.datasets = list(datasets)
        self.limit = limit

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        subs = [ds.provider(ctx, pass_index) for ds in self.datasets]
        current = [0] * self.num_workers
        ctx.register(ListNode(current))
        for a, b in zip(self.datasets, self.datasets[1:]):
            if getattr(getattr(b, "options", None), "batch_across_sources", False) and id(a) in ctx.feeds:
                # a's remainder of each worker stream opens b's first batch
                ctx.feeds[id(a)].queues.chain_to(ctx.feeds[id(b)].queues)

        return one_after_another(subs, current)

    def leaf_shares(self):
        out, before = {}, 0.0
        for ds in self.datasets:
            for leaf, (share, offset) in ds.leaf_shares().items():
                out[leaf] = (share, offset + before)
            before += len(ds) / self.num_workers
        return out

    def caps(self) -> Optional[List[int]]:
        if self.limit is None:
            return None
        workers = self.num_workers
        return [self.limit // workers + (1 if w < self.limit % workers else 0) for w in range(workers)]

    def _batched_across(self) -> bool:
        return all(getattr(getattr(ds, "options", None), "batch_across_sources", False) for ds in self.datasets)

    def worker_items(self) -> List[int]:
        """Items per worker: one batched stream through all datasets, or the sum of theirs; capped by ``limit``."""
        if self._batched_across():
            options = self.datasets[0].options
            pooled = add_per_worker([worker_samples(ds) for ds in self.datasets])
            items = [batch_count(n, options.batch_size, options.drop_last) for n in pooled]
        else:
            items = add_per_worker([worker_items(ds) for ds in self.datasets])
        caps = self.caps()
        return items if caps is None else [min(i, c) for i, c in zip(items, caps)]

    def __len__(self) -> int:
        if self._batched_across():
            return sum(self.worker_items())
        total = sum(len(ds) for ds in self.datasets)
        return min(total, self.limit) if self.limit is not None else total  # Energon's LimitDataset.len_rank

    def __repr__(self) -> str:
        return "ConcatDataset(" + ", ".join(repr(ds) for ds in self.datasets) + ")"


class MixBatchDataset(Composition):
    """Sample-level mixing: blend sources built with ``batch_size=1`` and group ``batch_size`` of
    their items per worker with ``batch_mix_fn`` (e.g. ``homogeneous_concat_mix``).

    Raises:
        TypeError: if ``batch_mix_fn`` returns ``None`` (it must return the mixed batch).
    """

    def __init__(
        self,
        *datasets: Tuple[Composition, float],
        batch_size: int,
        batch_mix_fn: Callable[[List[Any]], Any] = lambda x: x,
        worker_config: Any = None,
    ):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"MixBatchDataset: batch_size must be a positive int, got {batch_size!r}")
        self.blend = BlendDataset(*datasets, worker_config=worker_config)
        self.worker_config = self.blend.worker_config
        self.batch_size = batch_size
        self.batch_mix_fn = batch_mix_fn

    def leaves(self) -> List[Any]:
        return self.blend.leaves()

    def is_endless(self) -> bool:
        return self.blend.is_endless()

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        inner = self.blend.provider(ctx, pass_index)

        def next_item(worker: int) -> Any:
            group = []
            while len(group) < self.batch_size:
                item = inner(worker)
                if item is EXHAUSTED:
                    break
                group.append(item)
            if not group:
                return EXHAUSTED
            mixed = self.batch_mix_fn(group)
            if mixed is None:
                raise TypeError(
                    f"MixBatchDataset: batch_mix_fn {getattr(self.batch_mix_fn, '__name__', self.batch_mix_fn)!r} "
                    f"returned None for a group of {len(group)} {type(group[0]).__name__} items; it must return the mixed batch"
                )
            return mixed

        return next_item

    def leaf_shares(self):
        return self.blend.leaf_shares()

    def schedule_hints(self, pass_index: int):
        return self.blend.schedule_hints(pass_index, items_per_step=self.batch_size)

    def worker_items(self) -> List[int]:
        """Batches per worker: each worker groups its own blended items (Energon batches per worker)."""
        return [batch_count(n, self.batch_size, drop_last=False) for n in self.blend.worker_items()]

    def __len__(self) -> int:
        return sum(self.worker_items())


def one_after_another(subs: List[Provider], current: List[int]) -> Provider:
    """Per worker, the items of ``subs[current[worker]]`` until it is exhausted, then the next's
    (``current``: each worker's sub, a registered node's list)."""

    def next_item(worker: int) -> Any:
        while current[worker] < len(subs):
            item = subs[current[worker]](worker)
            if item is not EXHAUSTED:
                return item
            current[worker] += 1
        return EXHAUSTED

    return next_item
