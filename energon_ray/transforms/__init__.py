"""Geometric image augmentation merged into one warp, at Energon's path ``megatron.energon.transforms``.

``MergeTransform([Resize(...), RandomResizedCrop(...), RandomHorizontalFlip(), ...])`` (torchvision
transforms) composes the steps' matrices and resamples a PIL image or a float ``(C, H, W)`` tensor
once; the same torch seed gives the same image as Energon's. torchvision is needed only to build
the torchvision transforms themselves; this package does not import it.
"""

from energon_ray.transforms.mappers import (
    CenterCropMapper,
    CustomTransform,
    RandomCropMapper,
    RandomHorizontalFlipMapper,
    RandomPerspectiveMapper,
    RandomResizedCropMapper,
    RandomRotationMapper,
    RandomVerticalFlipMapper,
    ResizeMapper,
    TransformMapper,
)
from energon_ray.transforms.merge import MergeTransform

__all__ = [
    "TransformMapper",
    "ResizeMapper",
    "RandomResizedCropMapper",
    "CenterCropMapper",
    "RandomCropMapper",
    "RandomHorizontalFlipMapper",
    "RandomVerticalFlipMapper",
    "RandomRotationMapper",
    "RandomPerspectiveMapper",
    "MergeTransform",
    "CustomTransform",
]
