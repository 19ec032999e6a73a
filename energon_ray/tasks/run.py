"""Helpers the jobs, notebooks and benchmarks share: make a prepared dataset, drive a loader with stats."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from tqdm import tqdm

from energon_ray.synthetic import write_captioning_dataset, write_synthetic_dataset


def synthetic_captioning(
    root: Path | str,
    num_samples: int,
    samples_per_shard: int,
    image_size: Tuple[int, int] = (320, 240),
    split_ratio: Tuple[float, ...] = (8, 1, 1),
    progress: bool = True,
) -> Path:
    """Write (once) and prepare a captioning dataset of real JPEGs and captions under ``root``: only
    into a new or empty folder; a prepared one is used as is (see :func:`write_synthetic_dataset`)."""
    return write_synthetic_dataset(
        root,
        lambda folder: write_captioning_dataset(folder, num_samples, samples_per_shard, image_size=image_size),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard, image_size=image_size),
        split_ratio=split_ratio,
        sample_type="CaptioningSample",
        field_map={"image": "jpg", "caption": "txt"},
        progress=progress,
    )


@dataclasses.dataclass
class RunStats:
    """Throughput of one pass over a loader."""

    batches: int
    samples: int
    seconds: float
    first_batch_seconds: float
    steady_samples_per_second: float

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    def as_dict(self) -> Dict[str, Any]:
        return {**dataclasses.asdict(self), "samples_per_second": self.samples_per_second}


def drive(
    loader: Iterable[Any],
    *,
    max_batches: Optional[int] = None,
    batch_len: Callable[[Any], int] = len,
    on_batch: Optional[Callable[[int, Any], None]] = None,
    progress: bool = True,
    total: Optional[int] = None,
    asked_at: Optional[float] = None,
) -> RunStats:
    """Iterate ``loader`` (up to ``max_batches``) with a progress bar; measure samples/s.

    Steady-state throughput excludes the first batch (start-up of Ray workers and imports).
    ``asked_at``: the ``time.perf_counter()`` at which the caller asked for the data (before
    ``get_loader``, which starts the first pass at once): the clock starts there, not at ``iter()``.
    """
    start = time.perf_counter() if asked_at is None else asked_at
    first = None
    samples = steady = batches = 0
    bar = tqdm(total=max_batches or total, unit="batch", disable=not progress, dynamic_ncols=True)
    iterator = iter(loader)
    try:
        for batch in iterator:
            now = time.perf_counter()
            n = batch_len(batch)
            if first is None:
                first = now
            else:
                steady += n
            samples += n
            batches += 1
            if on_batch is not None:
                on_batch(batches - 1, batch)
            bar.update(1)
            bar.set_postfix(samples_per_s=f"{samples / max(now - start, 1e-9):.0f}")
            if max_batches is not None and batches >= max_batches:
                break
    finally:
        bar.close()
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    end = time.perf_counter()
    first_seconds = (first or end) - start
    return RunStats(
        batches=batches,
        samples=samples,
        seconds=end - start,
        first_batch_seconds=first_seconds,
        steady_samples_per_second=steady / (end - first) if first is not None and end > first else 0.0,
    )
