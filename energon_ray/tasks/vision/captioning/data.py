"""The synthetic captioning dataset of the default config: real JPEGs and captions, written once."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from energon_ray.tasks.run import synthetic_captioning


def synthetic(
    root: str | Path,
    num_samples: int = 96,
    samples_per_shard: int = 16,
    image_size: Sequence[int] = (48, 32),
    split_ratio: Sequence[float] = (4, 1, 1),
) -> Path:
    """Write and prepare (only into a new or empty folder; a prepared ``root`` is used as is: see
    :func:`energon_ray.synthetic.write_synthetic_dataset`) ``num_samples`` captioned images of
    ``image_size`` (width, height), split into whole shards by ``split_ratio`` (train/val/test).

    Example:
        >>> synthetic("/tmp/captions", num_samples=32)  # doctest: +SKIP
        PosixPath('/tmp/captions')
    """
    return synthetic_captioning(
        root, num_samples, samples_per_shard, image_size=tuple(image_size), split_ratio=tuple(split_ratio), progress=False
    )
