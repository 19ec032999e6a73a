"""The same task under ``ray.train``: a ``TorchTrainer`` whose workers each fit one rank with
Lightning's DDP through Ray's integration (``RayDDPStrategy``, ``RayLightningEnvironment``,
``prepare_trainer``, ``RayTrainReportCallback``).

Each worker builds the datamodule and the task from the resolved config; the datamodule takes its
rank and world size from the trainer, so every rank reads its own part of the data. Each epoch end
reports a Lightning checkpoint to Ray (every rank's loader state inside), and a worker group that
Ray restarts (``trainer.ray.max_failures``) continues from the latest one. Train workers get
fractional CPUs (``trainer.ray.cpus_per_worker``): they mostly wait for batches, and the loaders'
segment tasks need the cores. Ray itself is reached through ``energon_ray.ray_env``.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

from energon_ray.train.fit import TrainResult, fit_here


def fit_on_ray(cfg: DictConfig) -> TrainResult:
    """Fit ``cfg`` on ``cfg.trainer.ray.num_workers`` ``ray.train`` workers (on the Ray already
    initialized in this process, else a private local one or ``RAY_ADDRESS``'s cluster); rank 0's result."""
    from energon_ray.ray_env import run_torch_trainer
    from energon_ray.train.config import ray_options

    options = ray_options(cfg)
    result = run_torch_trainer(
        _train_loop,
        OmegaConf.to_container(cfg, resolve=True),
        num_workers=options["num_workers"],
        use_gpu=options["use_gpu"],
        cpus_per_worker=options["cpus_per_worker"],
        name=options["name"],
        storage_path=os.path.abspath(str(options["storage_path"] or os.path.join(cfg.work_dir, "ray_results"))),
        max_failures=options["max_failures"],
        what=_workers_asked(options),
    )
    summary = getattr(result, "return_value", None) or (result.metrics or {}).get("summary")
    if summary is None:
        raise RuntimeError(f"ray.train finished without a result from rank 0 (metrics: {result.metrics})")
    out = TrainResult(**summary)
    if result.checkpoint is not None:
        out.checkpoint = result.checkpoint.path
    return out


def _workers_asked(options: Dict[str, Any]) -> str:
    """The options that size the ray.train workers, as a refusal names them."""
    asked = f"trainer.ray.num_workers={options['num_workers']}, trainer.ray.cpus_per_worker={options['cpus_per_worker']:g}"
    return f"a ray.train worker ({asked}{', trainer.ray.use_gpu=true' if options['use_gpu'] else ''})"


def _train_loop(config: Dict[str, Any]) -> Dict[str, Any]:
    """One ray.train worker: fit this rank; rank 0's summary is the run's result."""
    from energon_ray.ray_env import LightningOnRay
    from energon_ray.train.config import ray_options

    cfg = OmegaConf.create(config)
    ray_side = LightningOnRay(use_gpu=ray_options(cfg)["use_gpu"])
    kwargs = dict(callbacks=[ray_side.callback], prepare_trainer=ray_side.prepare_trainer, **ray_side.overrides)
    if ray_side.checkpoint is None:
        result = fit_here(cfg, **kwargs)
    else:  # a restarted worker group: continue from the latest reported checkpoint
        with ray_side.checkpoint.as_directory() as folder:
            result = fit_here(cfg, ckpt_path=os.path.join(folder, ray_side.checkpoint_name), **kwargs)
    return ray_side.hand_back(result.to_dict())
