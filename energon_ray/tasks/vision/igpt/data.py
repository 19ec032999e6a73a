"""A synthetic image-classification dataset for iGPT: small PNGs whose pattern is their class."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
from PIL import Image

from energon_ray.synthetic import encode_image, write_shards, write_synthetic_dataset

#: The classes: what the pattern of an image is.
PATTERNS = ("horizontal stripes", "vertical stripes", "checkerboard", "diagonal")


def pattern_image(index: int, size: int, num_classes: int) -> Tuple[np.ndarray, int]:
    """uint8 ``(size, size, 3)`` pixels of sample ``index`` and its class: two colours (chosen by
    ``index``) laid out in the class's pattern.

    Example:
        >>> pixels, label = pattern_image(5, 8, 4)
        >>> pixels.shape, label
        ((8, 8, 3), 1)
    """
    if not 1 <= num_classes <= len(PATTERNS):
        raise ValueError(f"num_classes must be in [1, {len(PATTERNS)}], got {num_classes}")
    label = index % num_classes
    rng = np.random.default_rng([index, 17])
    colours = rng.integers(0, 2, size=(2, 3)) * 255
    if (colours[0] == colours[1]).all():
        colours[1] = 255 - colours[0]
    yy, xx = np.mgrid[0:size, 0:size]
    which = [yy % 2, xx % 2, (yy + xx) % 2, (yy >= xx).astype(int)][label]
    return colours[which].astype(np.uint8), label


def samples(num_samples: int, size: int, num_classes: int) -> List[Tuple[str, Dict[str, bytes]]]:
    """``(key, {"png", "cls"})`` samples."""
    out = []
    for i in range(num_samples):
        pixels, label = pattern_image(i, size, num_classes)
        out.append((f"pattern_{i:05d}", {"png": encode_image(Image.fromarray(pixels, "RGB"), "PNG"), "cls": str(label).encode()}))
    return out


def synthetic(
    root: str | Path,
    num_samples: int = 96,
    samples_per_shard: int = 16,
    image_size: int = 8,
    num_classes: int = 4,
    split_ratio: Sequence[float] = (4, 1, 1),
) -> Path:
    """Write and prepare (only into a new or empty folder; a prepared ``root`` is used as is: see
    :func:`energon_ray.synthetic.write_synthetic_dataset`) an ``ImageClassificationSample`` dataset
    of patterned ``image_size`` squared PNGs.

    Example:
        >>> synthetic("/tmp/patterns", num_samples=32)  # doctest: +SKIP
        PosixPath('/tmp/patterns')
    """
    return write_synthetic_dataset(
        root, lambda folder: write_shards(folder / "shards", samples(num_samples, image_size, num_classes), samples_per_shard),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard, image_size=image_size, num_classes=num_classes),
        split_ratio=tuple(split_ratio), sample_type="ImageClassificationSample",
        field_map={"image": "png", "label": "cls"}, progress=False,
    )  # fmt: skip
