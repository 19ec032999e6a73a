"""Instantiating a composed config: the datamodule, the task (with its backbone) and the trainer."""

from __future__ import annotations

import os
from typing import Any, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from energon_ray.train.config import ConfigError, check_choices


def build(cfg: DictConfig) -> Tuple[Any, Any]:
    """``(datamodule, task)`` of a composed config: ``cfg.dataset`` and ``cfg.task`` instantiated
    (the task's backbone, the task encoder's tokenizer … recursively, as their ``_target_`` say).

    Raises:
        ConfigError: no task or dataset chosen, or a constructor refused a value of ``dataset.*`` or
            ``task.*`` (``ValueError``/``TypeError``: the group and the constructor's message; with
            ``HYDRA_FULL_ERROR=1``, Hydra's own error and traceback instead).
    """
    check_choices(cfg)
    return _instantiate(cfg, "dataset"), _instantiate(cfg, "task")


def check_build(cfg: DictConfig) -> None:
    """Instantiate ``cfg.dataset`` and ``cfg.task`` once here and drop them, before ray.train workers
    build them each: a value a constructor refuses is then one ``ConfigError`` line in the driver,
    not a traceback per worker after the ``TorchTrainer`` started. (No data is written or read:
    the datamodule's ``prepare`` and its loaders run in the workers' ``fit``.)

    Raises:
        ConfigError: as ``build``.
    """
    build(cfg)


def _instantiate(cfg: DictConfig, group: str) -> Any:
    """``cfg[group]`` instantiated; an argument its constructor refuses is a ``ConfigError`` naming the
    group (Hydra's message was several lines around the constructor's, then a hint)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(cfg[group])
    except InstantiationException as exc:
        cause = exc.__cause__
        if not isinstance(cause, (ValueError, TypeError)) or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        raise ConfigError(f"{group}: {cause}") from exc


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
