"""Small synthetic datasets written as real WebDataset tar shards (for jobs, tests, benchmarks).

Images are real JPEG/PNG files made with Pillow; every sample's pixels and text encode its index,
so a test can tell exactly which sample it got.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

_WORDS = (
    "a red bus parked near the station", "two dogs playing in the snow", "a bowl of fresh fruit",
    "an old bridge over a quiet river", "a cat sleeping on a sofa", "children flying kites at the beach",
    "a mountain road at sunset", "a plate of pasta with basil", "a cyclist on a city street",
    "a lighthouse on a rocky coast",
)  # fmt: skip


def sample_image(index: int, size: Tuple[int, int] = (64, 48), seed: int = 0) -> Image.Image:
    """A deterministic RGB image whose mean colour and texture depend on ``index``."""
    width, height = size
    rng = np.random.default_rng([seed, index])
    base = np.array([(index * 37) % 256, (index * 91) % 256, (index * 53) % 256], dtype=np.float32)
    noise = rng.integers(0, 48, size=(height, width, 3)).astype(np.float32)
    gradient = np.linspace(0, 64, width, dtype=np.float32)[None, :, None]
    pixels = np.clip(base[None, None, :] * 0.75 + noise + gradient, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def encode_image(image: Image.Image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    """Encode a Pillow image to JPEG or PNG bytes."""
    buf = io.BytesIO()
    image.save(buf, format=fmt, quality=quality) if fmt == "JPEG" else image.save(buf, format=fmt)
    return buf.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes, mtime: Optional[float] = None) -> None:
    """Append one regular file to an open tar."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime if mtime is not None else time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_shards(
    out_dir: Path | str,
    samples: List[Tuple[str, Dict[str, bytes]]],
    samples_per_shard: int,
    prefix: str = "shard",
) -> List[Path]:
    """Write ``(key, {part: bytes})`` samples into ``out_dir/<prefix>_NNNN.tar`` shards."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard_no, start in enumerate(range(0, len(samples), samples_per_shard)):
        path = out / f"{prefix}_{shard_no:04d}.tar"
        write_tar(path, samples[start : start + samples_per_shard])
        paths.append(path)
    return paths


def write_tar(path: Path, samples: List[Tuple[str, Dict[str, bytes]]]) -> None:
    """One shard: each sample's parts as ``key.part`` members, in order (mtime 0: reproducible bytes)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, parts in samples:
            for part, data in parts.items():
                add_member(tar, f"{key}.{part}", data, mtime=0)


def captioning_samples(
    num_samples: int,
    image_size: Tuple[int, int] = (64, 48),
    image_format: str = "JPEG",
    seed: int = 0,
    start: int = 0,
    key_fn: Callable[[int], str] = lambda i: f"sample_{i:06d}",
) -> List[Tuple[str, Dict[str, bytes]]]:
    """Captioning samples: ``jpg`` (or ``png``) + ``txt`` caption + ``json`` metadata."""
    ext = "jpg" if image_format == "JPEG" else "png"
    out = []
    for i in range(start, start + num_samples):
        caption = f"{_WORDS[i % len(_WORDS)]} (sample {i})"
        parts = {
            ext: encode_image(sample_image(i, image_size, seed), image_format),
            "txt": caption.encode(),
            "json": json.dumps({"index": i, "tags": [f"t{i % 7}", f"g{i % 3}"], "meta": {"id": i}}).encode(),
        }
        out.append((key_fn(i), parts))
    return out


def write_captioning_dataset(
    out_dir: Path | str,
    num_samples: int,
    samples_per_shard: int,
    image_size: Tuple[int, int] = (64, 48),
    image_format: str = "JPEG",
    seed: int = 0,
    shard_subdir: str = "shards",
    processes: int = 1,
) -> List[Path]:
    """Write a captioning dataset's tar shards under ``out_dir/shard_subdir`` (not yet prepared);
    ``processes`` > 1 encodes shards in that many processes (the same bytes as one process)."""
    out = Path(out_dir) / shard_subdir
    if processes <= 1:
        return write_shards(out, captioning_samples(num_samples, image_size, image_format, seed), samples_per_shard)
    from concurrent.futures import ProcessPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, num_samples, samples_per_shard)
    jobs = [(out / f"shard_{no:04d}.tar", start, min(samples_per_shard, num_samples - start), image_size, image_format, seed)
            for no, start in enumerate(starts)]  # fmt: skip
    with ProcessPoolExecutor(processes) as pool:
        return list(pool.map(_write_captioning_shard, jobs))


def _write_captioning_shard(job) -> Path:
    path, start, count, image_size, image_format, seed = job
    write_tar(path, captioning_samples(count, image_size, image_format, seed, start=start))
    return path


def text_samples(num_samples: int, start: int = 0) -> List[Tuple[str, Dict[str, bytes]]]:
    """Text-only samples whose ``txt`` is the decimal index (keys ``{index:06d}``)."""
    return [(f"{i:06d}", {"txt": str(i).encode()}) for i in range(start, start + num_samples)]
