"""The synthetic video QA dataset of the default config: mp4 videos of a moving shape, and a question."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from energon_ray.synthetic import write_shards, write_synthetic_dataset
from energon_ray.synthetic_media import VIDEO_QA_FIELDS, video_qa_samples


def synthetic(
    root: str | Path,
    num_samples: int = 48,
    samples_per_shard: int = 8,
    num_frames: int = 10,
    size: Sequence[int] = (32, 24),
    split_ratio: Sequence[float] = (4, 1, 1),
) -> Path:
    """Write and prepare (only into a new or empty folder; a prepared ``root`` is used as is: see
    :func:`energon_ray.synthetic.write_synthetic_dataset`) ``num_samples`` ``VidQASample`` videos of
    ``size`` (width, height), split into whole shards by ``split_ratio``.

    Each video shows a white square or disc (by the sample's parity) crossing a coloured background;
    its first answer names the shape (see :func:`energon_ray.synthetic_media.video_qa_samples`).

    Example:
        >>> synthetic("/tmp/videos", num_samples=16)  # doctest: +SKIP
        PosixPath('/tmp/videos')
    """
    return write_synthetic_dataset(
        root, lambda folder: write_shards(folder / "shards", video_qa_samples(num_samples, num_frames, tuple(size)), samples_per_shard),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard, num_frames=num_frames, size=tuple(size)),
        split_ratio=tuple(split_ratio), sample_type="VidQASample", field_map=VIDEO_QA_FIELDS, progress=False,
    )  # fmt: skip
