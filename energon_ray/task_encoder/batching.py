"""Batching helpers: how a list of per-sample values becomes one batched value."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List

import torch

FeatureBatcher = Callable[[List[Any]], Any]


def batch_stack(batch: List[Any]) -> torch.Tensor:
    """Stack same-shaped tensors along a new first dimension.

    Example:
        >>> batch_stack([torch.zeros(2), torch.ones(2)]).shape
        torch.Size([2, 2])
    """
    return torch.stack(batch, dim=0)


def batch_pad_stack(batch: List[Any]) -> torch.Tensor:
    """Stack tensors of different shapes, zero-padding each dimension to the largest.

    Example:
        >>> batch_pad_stack([torch.ones(1), torch.ones(3)]).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    """
    first = batch[0]
    if all(t.shape == first.shape for t in batch):
        return torch.stack(batch, dim=0)
    max_size = [max(t.shape[d] for t in batch) for d in range(first.ndim)]
    out = first.new_zeros((len(batch), *max_size))
    for i, t in enumerate(batch):
        out[(i, *(slice(0, s) for s in t.shape))] = t
    return out


def batch_list(batch: List[Any]) -> List[Any]:
    """Keep the values as a list."""
    return batch


def generic_batch(batch: List[Any]) -> Any:
    """Pad-stack tensors, recurse into dicts, dataclasses and NamedTuples, list everything else.

    Example:
        >>> generic_batch([{"a": torch.ones(2), "b": "x"}, {"a": torch.ones(2), "b": "y"}])["b"]
        ['x', 'y']
    """
    first = batch[0]
    if isinstance(first, torch.Tensor):
        return batch_pad_stack(batch)
    if isinstance(first, dict):
        return {key: generic_batch([sample[key] for sample in batch]) for key in first.keys()}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        if hasattr(first, "from_samples"):
            return first.from_samples(batch)
        return type(first)(
            **{f.name: generic_batch([getattr(s, f.name) for s in batch]) for f in dataclasses.fields(first)}
        )
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(**{name: generic_batch([getattr(s, name) for s in batch]) for name in first._fields})
    return batch_list(batch)
