"""``CaptioningTask``: next-token cross entropy on the caption, given the image."""

from __future__ import annotations

import torch

from energon_ray.tasks.captioning import CaptioningBatch
from energon_ray.tasks.module import TaskModule, masked_token_loss


class CaptioningTask(TaskModule):
    """Teacher-forced captioning: the backbone reads the image and the caption's tokens so far.

    The backbone is called as ``backbone(images, tokens) -> logits`` (e.g. ``TinyCaptioner``);
    padding (``text_attn_mask == 0``) is left out of the loss.
    """

    def loss(self, batch: CaptioningBatch) -> torch.Tensor:
        tokens, mask = batch.text_tokens, batch.text_attn_mask
        logits = self.model(batch.images, tokens[:, :-1])
        return masked_token_loss(logits, tokens[:, 1:], mask[:, 1:])
