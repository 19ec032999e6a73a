"""``GenerativePixelsTask``: next-pixel cross entropy, plus a classification loss with ``classify``."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from energon_ray.tasks.module import OptimizerFactory, SchedulerFactory, TaskModule
from energon_ray.tasks.vision.igpt.encoder import ImageGPTBatch


class GenerativePixelsTask(TaskModule):
    """iGPT: the backbone (``backbone(pixels, classify) -> [class logits,] pixel logits``, e.g.
    ``GPT2``) predicts each quantised pixel; with ``classify`` the loss adds the class's cross entropy.

    Args:
        backbone, optimizer, scheduler: as in ``TaskModule``.
        classify: train the classification head too (and log ``train_accuracy``/``val_accuracy``).
    """

    def __init__(self, backbone: nn.Module, optimizer: Optional[OptimizerFactory] = None, scheduler: Optional[SchedulerFactory] = None, classify: bool = False):
        super().__init__(backbone, optimizer, scheduler)
        self.classify = classify
        self.criterion = nn.CrossEntropyLoss()

    def loss(self, batch: ImageGPTBatch) -> torch.Tensor:
        loss, _ = self._losses(batch)
        return loss

    def _losses(self, batch: ImageGPTBatch) -> Any:
        x = batch.pixels
        if not self.classify:
            logits = self.model(x)
            return self.criterion(logits.reshape(-1, logits.shape[-1]), x.reshape(-1)), None
        clf_logits, logits = self.model(x, classify=True)
        gen_loss = self.criterion(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        accuracy = (clf_logits.argmax(-1) == batch.labels).float().mean()
        return gen_loss + self.criterion(clf_logits, batch.labels), accuracy

    def training_step(self, batch: ImageGPTBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: ImageGPTBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: ImageGPTBatch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def _step(self, batch: ImageGPTBatch, stage: str) -> torch.Tensor:
        loss, accuracy = self._losses(batch)
        size = batch.pixels.shape[0]
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=size)
        if accuracy is not None:
            self.log(f"{stage}_accuracy", accuracy, batch_size=size)
        return loss
