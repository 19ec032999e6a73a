"""Fitting a composed task: in this process, or under ``ray.train`` when ``trainer.ray.num_workers > 0``."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import lightning.pytorch as pl
from omegaconf import DictConfig, OmegaConf

from energon_ray.ray_settings import verbose
from energon_ray.train.build import build, check_build, make_trainer
from energon_ray.train.config import (
    ConfigError, check_choices, check_loader, check_loader_fits, check_ray_trainer, check_run, check_trainer, is_lightning_ckpt_name,
    ray_options, with_absolute_paths,
)  # fmt: skip


#: the loggers of Lightning's rank-zero info lines (whichever of the two Lightning packages was imported last logs them)
LIGHTNING_INFO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


def quiet_lightning() -> None:
    """Lightning's own chatter off unless ``ENERGON_RAY_VERBOSE=1``: its rank-zero info lines (the
    hardware it found, tips to install its cloud products, why ``fit`` stopped) and torch's notice
    that an API Lightning's internals call is deprecated. Its warnings about the user's config and
    model (``warnings.warn``) stay, and so does a level the user set on these loggers."""
    if verbose():
        return
    for name in LIGHTNING_INFO_LOGGERS:
        log = logging.getLogger(name)
        if log.level == logging.NOTSET:
            log.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


class LossHistory(pl.Callback):
    """Keeps every training step's loss (``losses``), on each rank."""

    def __init__(self) -> None:
        self.losses: List[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.losses.append(float(loss))


@dataclasses.dataclass
class TrainResult:
    """What a run did (rank 0's view).

    Attributes:
        losses: the training loss of every step.
        global_step: optimizer steps taken.
        world_size: ranks that trained.
        metrics: the trainer's last logged values (``val_loss``, ``test_loss`` …).
        checkpoint: the last checkpoint written (a file, or with ``ray.train`` the checkpoint folder), if any.
    """

    losses: List[float]
    global_step: int
    world_size: int
    metrics: Dict[str, float]
    checkpoint: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def fit(cfg: DictConfig) -> TrainResult:
    """Train the configured task: here, or with ``trainer.ray.num_workers > 0`` on that many
    ``ray.train`` workers; ``cfg.test`` then runs the test split.

    Example:
        >>> from energon_ray.train import compose
        >>> fit(compose(["+task=vision/captioning", "+dataset=vision/captioning/synthetic", "trainer.max_steps=5"]))  # doctest: +SKIP
    """
    check_choices(cfg)  # here, not only in each ray.train worker
    cfg = with_absolute_paths(cfg)
    check_ckpt_path(cfg.get("ckpt_path"), root_dir=OmegaConf.select(cfg, "trainer.default_root_dir"))
    check_run(cfg)
    check_trainer(cfg)
    check_loader(cfg)
    if ray_options(cfg)["num_workers"] > 0:
        check_ray_trainer(cfg)
    check_loader_fits(cfg)
    if ray_options(cfg)["num_workers"] > 0:
        from energon_ray.train.ray_launch import fit_on_ray

        check_build(cfg)
        return fit_on_ray(cfg)
    return fit_here(cfg)


#: what a checkpoint folder that ``ckpt_path`` names holds: ray.train's report (``RayTrainReportCallback``)
#: and Lightning's latest (``ModelCheckpoint(save_last=True)``)
CHECKPOINT_FILES = ("checkpoint.ckpt", "last.ckpt")


def checkpoint_file(path: Optional[str]) -> Optional[str]:
    """``ckpt_path`` as Lightning takes it: a file, or the checkpoint file inside a folder (the
    ``checkpoint: …/checkpoint_<time>`` folder a ray.train run prints).

    Raises:
        FileNotFoundError: a folder with none of ``CHECKPOINT_FILES`` (naming its ``.ckpt`` files).
    """
    if not path or not os.path.isdir(str(path)):
        return path
    for name in CHECKPOINT_FILES:
        if os.path.isfile(os.path.join(str(path), name)):
            return os.path.join(str(path), name)
    found = sorted(f for f in os.listdir(str(path)) if f.endswith(".ckpt"))[:5]
    raise FileNotFoundError(
        f"ckpt_path={path} is a folder without {' or '.join(CHECKPOINT_FILES)}"
        + (f"; name one of its checkpoints: {', '.join(found)}" if found else " (and no .ckpt file)")
    )


def check_ckpt_path(path: Optional[str], root_dir: Optional[str] = None) -> None:
    """Refuse a local ``ckpt_path`` that names no checkpoint, or a Lightning name that ``Trainer.fit``
    would refuse in a new process, before anything is built or Ray started (Lightning finds out only
    after the model, the loaders and, under ray.train, every worker started).

    Args:
        path: the config's ``ckpt_path``.
        root_dir: ``trainer.default_root_dir``, where ``ckpt_path=hpc`` looks for its checkpoints.

    Raises:
        ConfigError: no such file or folder, a folder without ``CHECKPOINT_FILES``, ``best`` (a new
            run has no best checkpoint), ``hpc`` without an ``hpc_ckpt_*`` file in ``root_dir``, or
            ``registry`` without the ``litmodels`` package.
    """
    if is_lightning_ckpt_name(path):
        _check_lightning_ckpt_name(str(path), root_dir)
        return
    if not path or "://" in str(path):
        return
    if not os.path.exists(str(path)):
        raise ConfigError(f"ckpt_path={path} does not exist (name a checkpoint file, or the checkpoint folder a ray.train run printed)")
    try:
        checkpoint_file(str(path))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None


#: what to name instead of a Lightning name that finds no checkpoint
CKPT_PATH_HINT = "name a checkpoint file, or the checkpoint folder a ray.train run printed"


def _check_lightning_ckpt_name(name: str, root_dir: Optional[str]) -> None:
    """Refuse the Lightning names for ``ckpt_path`` whose ``Trainer.fit`` in a new process would raise."""
    if name == "best":
        raise ConfigError(
            "ckpt_path=best: a new run has no best checkpoint (Lightning knows it only after a fit in the "
            f"same process); {CKPT_PATH_HINT}, or ckpt_path=last for the configured ModelCheckpoint's newest"
        )
    if name == "hpc" and not _has_hpc_checkpoint(root_dir):
        raise ConfigError(f"ckpt_path=hpc: no hpc_ckpt_*.ckpt file in trainer.default_root_dir={root_dir}; {CKPT_PATH_HINT}")
    if name.lower().startswith("registry") and importlib.util.find_spec("litmodels") is None:
        raise ConfigError(f"ckpt_path={name} needs the litmodels package (pip install litmodels); or {CKPT_PATH_HINT}")


def _has_hpc_checkpoint(root_dir: Optional[str]) -> bool:
    """Whether ``root_dir`` holds a checkpoint Lightning's ``ckpt_path=hpc`` finds (an object store URL: left to it)."""
    if root_dir and "://" in str(root_dir):
        return True
    folder = str(root_dir) if root_dir else os.getcwd()
    return os.path.isdir(folder) and any("hpc_ckpt_" in name for name in os.listdir(folder))


def fit_here(
    cfg: DictConfig,
    callbacks: Sequence[Any] = (),
    prepare_trainer: Optional[Callable[[pl.Trainer], pl.Trainer]] = None,
    ckpt_path: Optional[str] = None,
    **trainer_overrides: Any,
) -> TrainResult:
    """Build the datamodule, task and trainer of ``cfg`` in this process and fit (then test if
    ``cfg.test``); ``ray.train`` workers call it with their strategy and plugins as overrides."""
    quiet_lightning()
    pl.seed_everything(int(cfg.seed), verbose=False)
    datamodule, task = build(cfg)
    history = LossHistory()
    trainer = make_trainer(cfg, callbacks=[history, *callbacks], **trainer_overrides)
    if prepare_trainer is not None:
        trainer = prepare_trainer(trainer)
    trainer.fit(task, datamodule=datamodule, ckpt_path=checkpoint_file(ckpt_path or cfg.get("ckpt_path")))
    if cfg.get("test"):
        trainer.test(task, datamodule=datamodule)
    checkpoint = getattr(trainer.checkpoint_callback, "last_model_path", None) or getattr(trainer.checkpoint_callback, "best_model_path", None)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items() if getattr(value, "numel", lambda: 1)() == 1}
    return TrainResult(
        losses=history.losses, global_step=int(trainer.global_step), world_size=int(trainer.world_size), metrics=metrics,
        checkpoint=checkpoint or None,
    )  # fmt: skip
