"""Instantiating a composed config: the datamodule, the task (with its backbone) and the trainer."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from energon_ray.train.config import check_choices


def build(cfg: DictConfig) -> Tuple[Any, Any]:
    """``(datamodule, task)`` of a composed config: ``cfg.dataset`` and ``cfg.task`` instantiated
    (the task's backbone, the task encoder's tokenizer … recursively, as their ``_target_`` say).

    Raises:
        ConfigError: no task or dataset chosen.
    """
    from hydra.utils import instantiate

    check_choices(cfg)
    datamodule = instantiate(cfg.dataset)
    task = instantiate(cfg.task)
    return datamodule, task


def make_trainer(cfg: DictConfig, callbacks: Sequence[Any] = (), **overrides: Any) -> Any:
    """The Lightning ``Trainer`` of ``cfg.trainer`` (its ``ray`` part left out), with its configured
    callbacks followed by ``callbacks``; ``overrides`` replace configured arguments (``strategy=…``)."""
    from hydra.utils import instantiate

    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    options.pop("ray", None)
    configured: List[Any] = [instantiate(c) for c in options.pop("callbacks", None) or []]
    if options.get("enable_checkpointing") is False:  # Lightning refuses a ModelCheckpoint then
        from lightning.pytorch.callbacks import ModelCheckpoint

        configured = [c for c in configured if not isinstance(c, ModelCheckpoint)]
    options.update(overrides)
    return instantiate(options, callbacks=[*configured, *callbacks], _convert_="all")
