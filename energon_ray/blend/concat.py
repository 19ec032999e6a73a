"""Concatenating already-batched items into one batch (``MixBatchDataset``'s ``batch_mix_fn``s)."""

from __future__ import annotations

import dataclasses
from typing import Any, List

import torch


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
