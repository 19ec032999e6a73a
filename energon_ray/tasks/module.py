"""``TaskModule``: the base of every task's LightningModule (Lightning Transformers' ``TaskTransformer``).

A task holds a backbone (any ``nn.Module``, built from the ``backbone`` config), an optimizer and an
optional learning-rate scheduler (both ``functools.partial`` objects from Hydra's ``_partial_: true``),
and defines one method, ``loss(batch)``. Training, validation and test steps log
``train_loss``/``val_loss``/``test_loss`` with the batch's size.

Example:
    >>> class Regression(TaskModule):
    ...     def loss(self, batch):
    ...         return torch.nn.functional.mse_loss(self.model(batch.x), batch.y)
    >>> Regression(torch.nn.Linear(2, 1)).configure_optimizers().__class__.__name__
    'AdamW'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Optional

import lightning.pytorch as pl
import torch
from torch import nn

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class TaskModule(pl.LightningModule):
    """Backbone + optimizer (+ scheduler); subclasses define ``loss(batch)``.

    Args:
        backbone: the model (``self.model``).
        optimizer: ``optimizer(parameters) -> Optimizer``; default AdamW with lr 1e-3.
        scheduler: ``scheduler(optimizer) -> LRScheduler``, stepped every training step; default none.
    """

    def __init__(self, backbone: nn.Module, optimizer: Optional[OptimizerFactory] = None, scheduler: Optional[SchedulerFactory] = None):
        super().__init__()
        if not isinstance(backbone, nn.Module):
            raise TypeError(f"{type(self).__name__}: backbone must be an nn.Module, got {type(backbone).__name__}")
        self.model = backbone
        self.optimizer_factory = optimizer or functools.partial(torch.optim.AdamW, lr=1e-3)
        self.scheduler_factory = scheduler

    def loss(self, batch: Any) -> torch.Tensor:
        """The scalar loss of one batch (what every step computes)."""
        raise NotImplementedError(f"{type(self).__name__} must define loss(batch)")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch_size_of(batch))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("val_loss", loss, prog_bar=True, batch_size=batch_size_of(batch))
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("test_loss", loss, batch_size=batch_size_of(batch))
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer), "interval": "step"}}


def batch_size_of(batch: Any) -> Optional[int]:
    """Rows of a batch: the first dimension of its first tensor field (``None`` if it has none).

    Example:
        >>> @dataclasses.dataclass
        ... class B:
        ...     keys: list
        ...     x: torch.Tensor
        >>> batch_size_of(B(["a", "b"], torch.zeros(2, 5)))
        2
    """
    values = [getattr(batch, f.name) for f in dataclasses.fields(batch)] if dataclasses.is_dataclass(batch) else []
    if isinstance(batch, dict):
        values = list(batch.values())
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def masked_token_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the positions where ``mask`` is nonzero.

    Example:
        >>> logits = torch.zeros(1, 2, 4)
        >>> round(float(masked_token_loss(logits, torch.tensor([[1, 0]]), torch.tensor([[1, 0]]))), 4)
        1.3863
    """
    flat = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")
    weights = mask.reshape(-1).to(flat.dtype)
    return (flat * weights).sum() / weights.sum().clamp_min(1)
