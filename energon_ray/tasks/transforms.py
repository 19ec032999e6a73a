"""Image transforms on CHW float tensors, torch only (torchvision is not required)."""

from __future__ import annotations

import math
import random
from typing import Callable, List, Sequence, Tuple

import torch
import torch.nn.functional as F


def _size(size: int | Sequence[int]) -> Tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: List[Callable[[torch.Tensor], torch.Tensor]]):
        self.transforms = list(transforms)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            image = t(image)
        return image


class Resize:
    """Resize a ``(C, H, W)`` image to ``size`` (bilinear, antialiased)."""

    def __init__(self, size: int | Sequence[int]):
        self.size = _size(size)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return F.interpolate(image[None].float(), size=self.size, mode="bilinear", antialias=True, align_corners=False)[0]


class RandomResizedCrop:
    """Crop a random area/aspect ratio (seeded by the loader per sample) and resize to ``size``.

    Example:
        >>> RandomResizedCrop(8)(torch.rand(3, 20, 30)).shape
        torch.Size([3, 8, 8])
    """

    def __init__(self, size: int | Sequence[int], scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size = _size(size)
        self.scale = scale
        self.ratio = ratio

    def _box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        area = height * width
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        side = min(height, width)
        return (height - side) // 2, (width - side) // 2, side, side

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, h, w = self._box(image.shape[-2], image.shape[-1])
        crop = image[..., top : top + h, left : left + w]
        return F.interpolate(crop[None].float(), size=self.size, mode="bilinear", antialias=True, align_corners=False)[0]


class RandomHorizontalFlip:
    """Flip left-right with probability ``p``."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.flip(-1) if random.random() < self.p else image
