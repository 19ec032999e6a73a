"""The captioning task encoder; its home is :mod:`energon_ray.tasks.captioning` (jobs and notebooks use it)."""

from energon_ray.tasks.captioning import CaptioningBatch, CaptioningRawBatch, CaptioningTaskEncoder, default_train_transform

__all__ = ["CaptioningBatch", "CaptioningRawBatch", "CaptioningTaskEncoder", "default_train_transform"]
