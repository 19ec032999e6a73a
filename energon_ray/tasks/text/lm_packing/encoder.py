"""The text-packing task encoder; its home is :mod:`energon_ray.tasks.text_packing` (tests and notebooks use it)."""

from energon_ray.tasks.text_packing import PackedSequence, PackedTextBatch, TextPackingTaskEncoder, TokenizedDocument

__all__ = ["PackedSequence", "PackedTextBatch", "TextPackingTaskEncoder", "TokenizedDocument"]
