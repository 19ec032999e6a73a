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
    """Before ray.train workers build the run each: ``cfg.dataset`` instantiated once here and
    dropped (a datamodule only keeps its settings; no data is read or written: ``prepare`` and the
    loaders run in the workers' ``fit``), and ``cfg.task``'s arguments matched to its constructor's
    (the task itself, with its backbone's weights, is not built in the driver). A value a
    constructor refuses, or an argument the task does not take, is then one ``ConfigError`` line in
    the driver, not a traceback per worker after the ``TorchTrainer`` started.

    Raises:
        ConfigError: as ``build`` (an argument the task does not take, or one it lacks, also).
    """
    check_choices(cfg)
    _instantiate(cfg, "dataset")
    _check_arguments(cfg, "task")


def _check_arguments(cfg: DictConfig, group: str) -> None:
    """``cfg[group]``'s keys bound to its ``_target_``'s signature, without calling it."""
    import inspect

    from hydra.utils import get_method

    node = cfg[group]
    target = node.get("_target_")
    if target is None or node.get("_partial_", False):
        return
    try:
        fn = get_method(str(target))
        signature = inspect.signature(fn)
    except (ImportError, ValueError, TypeError):  # instantiating it in the workers says what is wrong
        return
    arguments = {key: value for key, value in node.items() if not str(key).startswith("_")}
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        name = getattr(fn, "__name__", str(target))
        raise ConfigError(f"{group}: {name}.__init__() {exc}" if inspect.isclass(fn) else f"{group}: {name}() {exc}") from None


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
