"""``PackedLMTask``: next-token cross entropy on packed rows (``labels`` already shifted, -100 ignored)."""

from __future__ import annotations

import torch
from torch import nn

from energon_ray.tasks.module import TaskModule
from energon_ray.tasks.text_packing import PackedTextBatch


class PackedLMTask(TaskModule):
    """The backbone is called as ``backbone(input_ids, position_ids, document_ids) -> logits`` (e.g.
    ``PackedGPT``); ``labels`` hold the next token of the same document, -100 across document
    boundaries and on padding, as ``TextPackingTaskEncoder`` makes them."""

    def loss(self, batch: PackedTextBatch) -> torch.Tensor:
        logits = self.model(batch.input_ids, batch.position_ids, batch.document_ids)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch.labels.reshape(-1), ignore_index=-100)
