"""The collate function handed to ``iter_torch_batches``: rows → decoded items, pinned if asked.

It runs in Ray's prefetch threads, so payload decoding and pinning overlap with training.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import pyarrow as pa
import torch
from ray.data.collate_fn import ArrowBatchCollateFn

from energon_ray.pipeline import rows, serde
from energon_ray.samples.base import _pin


def pin_batch(value: Any) -> Any:
    """Pin every tensor inside a batch: ``Batch`` dataclasses, other dataclasses, dicts, lists."""
    if hasattr(value, "pin_memory") and not isinstance(value, torch.Tensor):
        return value.pin_memory()
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            setattr(value, field.name, _pin(getattr(value, field.name)))
        return value
    return _pin(value)


class DecodedRows:
    """The collated result: decoded rows of one block and their leaf datasets (not a tensor, so
    Ray passes it through)."""

    __slots__ = ("rows", "sources")

    def __init__(self, rows_: List[Tuple[int, int, int, int, Any]], sources: List[int]):
        self.rows = rows_
        self.sources = sources


class RowCollate(ArrowBatchCollateFn):
    """Decode payloads of a block of rows; pin item payloads when ``pin`` is set."""

    def __init__(self, pin: bool):
        super().__init__()
        self.pin = pin

    def __call__(self, batch: pa.Table) -> DecodedRows:
        out = []
        for kind, worker, segment, seq, payload in rows.iter_rows(batch):
            value = serde.loads(payload)
            if self.pin and kind == rows.ITEM:
                value = pin_batch(value)
            out.append((kind, worker, segment, seq, value))
        return DecodedRows(out, rows.sources(batch))
