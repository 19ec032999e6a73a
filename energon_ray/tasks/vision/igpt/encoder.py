"""Images as pixel sequences: a fixed colour quantiser and the task encoder that applies it."""

from __future__ import annotations

from typing import List, Optional

import torch

from energon_ray.samples import Batch, ImageClassificationSample, Sample, edataclass
from energon_ray.task_encoder import DefaultTaskEncoder
from energon_ray.tasks.transforms import Resize


class PixelQuantizer:
    """RGB colours → ids on a regular grid: ``levels`` values per channel, ``levels ** 3`` ids.

    Where iGPT clusters the colours of its training set, this grid needs no data and no state, so
    every Ray worker quantises the same way.

    Args:
        vocab_size: number of colours, a cube (8, 27, 64 … 512).

    Raises:
        ValueError: ``vocab_size`` is not the cube of an int >= 2.

    Example:
        >>> q = PixelQuantizer(vocab_size=8)
        >>> q.encode(torch.tensor([[[0.0, 1.0]], [[0.0, 1.0]], [[0.0, 0.2]]])).tolist()
        [0, 6]
    """

    def __init__(self, vocab_size: int = 27):
        levels = round(vocab_size ** (1 / 3))
        if levels < 2 or levels**3 != vocab_size:
            raise ValueError(f"PixelQuantizer: vocab_size must be a cube >= 8 (levels per channel ** 3), got {vocab_size}")
        self.vocab_size = vocab_size
        self.levels = levels

    def __repr__(self) -> str:
        return f"PixelQuantizer(vocab_size={self.vocab_size})"

    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """``(3, H, W)`` floats in [0, 1] → ``(H * W,)`` long ids, row by row."""
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"PixelQuantizer.encode needs a (3, H, W) RGB image, got shape {tuple(image.shape)}")
        q = (image.float().clamp(0, 1) * (self.levels - 1)).round().long()
        ids = (q[0] * self.levels + q[1]) * self.levels + q[2]
        return ids.flatten()

    def decode(self, ids: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Ids → a ``(3, height, width)`` float image of the grid's colours (to look at samples)."""
        ids = ids.long().view(height, width)
        channels = [ids // (self.levels**2), (ids // self.levels) % self.levels, ids % self.levels]
        return torch.stack(channels).float() / (self.levels - 1)


@edataclass
class PixelSample(Sample):
    """One image as quantised pixel ids, with its class."""

    pixels: torch.Tensor
    label: int


@edataclass
class ImageGPTBatch(Batch):
    """``pixels``: ``(B, H * W)`` long ids; ``labels``: ``(B,)`` class ids (-1 where unknown)."""

    pixels: torch.Tensor
    labels: torch.Tensor


class ImageGPTTaskEncoder(DefaultTaskEncoder[ImageClassificationSample, PixelSample, ImageGPTBatch, ImageGPTBatch]):
    """Resize each image to ``image_size`` squared, quantise its pixels, stack a batch.

    Args:
        tokenizer: the colour quantiser (``encode(image) -> ids``); default ``PixelQuantizer(27)``.
        image_size: side the images are resized to (sequences are ``image_size ** 2`` long).
    """

    def __init__(self, tokenizer: Optional[PixelQuantizer] = None, image_size: int = 8):
        super().__init__()
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"ImageGPTTaskEncoder: image_size must be a positive int, got {image_size!r}")
        self.tokenizer = tokenizer or PixelQuantizer()
        self.image_size = image_size
        self.resize = Resize(image_size)

    def __repr__(self) -> str:
        return f"ImageGPTTaskEncoder(tokenizer={self.tokenizer!r}, image_size={self.image_size})"

    def encode_sample(self, sample: ImageClassificationSample) -> PixelSample:
        image = sample.image
        if tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            image = self.resize(image)
        label = -1 if sample.label is None else int(sample.label)
        return PixelSample.derive_from(sample, pixels=self.tokenizer.encode(image), label=label)

    def batch(self, samples: List[PixelSample]) -> ImageGPTBatch:
        return ImageGPTBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=tuple(s.__restore_key__ for s in samples),
            __subflavors__=[s.__subflavors__ for s in samples],
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            pixels=torch.stack([s.pixels for s in samples]),
            labels=torch.tensor([s.label for s in samples], dtype=torch.long),
        )
