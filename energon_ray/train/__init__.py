"""The training entry point: a task's pieces composed by Hydra, fitted by Lightning (here or in ``ray.train``).

    python -m energon_ray.train +task=vision/captioning +dataset=vision/captioning/synthetic trainer.max_steps=50
    python -m energon_ray.train +task=vision/captioning +dataset=vision/captioning/synthetic trainer.ray.num_workers=2

From Python: ``fit(compose(["+task=vision/captioning", "+dataset=vision/captioning/synthetic"]))``.
``config.py`` composes the configs, ``build.py`` instantiates the datamodule, task and trainer,
``fit.py`` runs them in this process, ``ray_launch.py`` under ``ray.train``'s ``TorchTrainer``.
"""

from energon_ray.train.build import build, make_trainer
from energon_ray.train.config import compose
from energon_ray.train.fit import LossHistory, TrainResult, fit

__all__ = ["LossHistory", "TrainResult", "build", "compose", "fit", "make_trainer"]
