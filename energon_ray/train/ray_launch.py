"""The same task under ``ray.train``: a ``TorchTrainer`` whose workers each fit one rank with
Lightning's DDP through Ray's integration (``RayDDPStrategy``, ``RayLightningEnvironment``,
``prepare_trainer``, ``RayTrainReportCallback``).

Each worker builds the datamodule and the task from the resolved config; the datamodule takes its
rank and world size from the trainer, so every rank reads its own part of the data. Each epoch end
reports a Lightning checkpoint to Ray (every rank's loader state inside), and a worker group that
Ray restarts (``trainer.ray.max_failures``) continues from the latest one. Train workers get
fractional CPUs (``trainer.ray.cpus_per_worker``): they mostly wait for batches, and the loaders'
segment tasks need the cores. Ray is imported here only, when a run asks for it.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

from energon_ray.train.fit import TrainResult, fit_here


def fit_on_ray(cfg: DictConfig) -> TrainResult:
    """Fit ``cfg`` on ``cfg.trainer.ray.num_workers`` ``ray.train`` workers (on the Ray already
    initialized in this process, else a private local one or ``RAY_ADDRESS``'s cluster); rank 0's result."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from energon_ray.ray_env import ensure_ray

    ensure_ray()
    options = cfg.trainer.ray
    config = OmegaConf.to_container(cfg, resolve=True)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=int(options.num_workers),
            use_gpu=bool(options.get("use_gpu", False)),
            resources_per_worker={"CPU": float(options.get("cpus_per_worker", 0.25))},
        ),
        run_config=RunConfig(
            name=options.get("name"),
            storage_path=os.path.abspath(str(options.get("storage_path") or os.path.join(cfg.work_dir, "ray_results"))),
            failure_config=FailureConfig(max_failures=int(options.get("max_failures", 0))),
        ),
    )
    result = trainer.fit()
    summary = getattr(result, "return_value", None) or (result.metrics or {}).get("summary")
    if summary is None:
        raise RuntimeError(f"ray.train finished without a result from rank 0 (metrics: {result.metrics})")
    out = TrainResult(**summary)
    if result.checkpoint is not None:
        out.checkpoint = result.checkpoint.path
    return out


def _train_loop(config: Dict[str, Any]) -> Dict[str, Any]:
    """One ray.train worker: fit this rank; rank 0's summary is the run's result."""
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    cfg = OmegaConf.create(config)
    use_gpu = bool(cfg.trainer.ray.get("use_gpu", False))
    overrides = dict(
        strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], devices="auto",
        accelerator="gpu" if use_gpu else "cpu",
    )  # fmt: skip
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        result = fit_here(cfg, callbacks=[RayTrainReportCallback()], prepare_trainer=prepare_trainer, **overrides)
    else:  # a restarted worker group: continue from the latest reported checkpoint
        with checkpoint.as_directory() as folder:
            path = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
            result = fit_here(cfg, callbacks=[RayTrainReportCallback()], prepare_trainer=prepare_trainer, ckpt_path=path, **overrides)
    summary = result.to_dict()
    if not _return_values_supported():
        ray.train.report({"summary": summary})
    return summary


def _return_values_supported() -> bool:
    """Ray Train v2 hands rank 0's return value to the driver; v1 only reported metrics."""
    try:
        from ray.train.v2._internal.constants import is_v2_enabled

        return bool(is_v2_enabled())
    except ImportError:
        return False
