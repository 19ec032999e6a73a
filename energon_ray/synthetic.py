"""Small synthetic datasets written as real WebDataset tar shards (for jobs, tests, benchmarks).

Images are real JPEG/PNG files made with Pillow; every sample's pixels and text encode its index,
so a test can tell exactly which sample it got. :func:`write_synthetic_dataset` writes and prepares
one only into a new or empty folder: a task config's ``dataset.path`` may name a user's own shards.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from energon_ray.errors import DatasetConfigError
from energon_ray.format.pool import process_pool
from energon_ray.format.prepare import already_prepared, prepare_dataset

#: Written into the folder before anything else and removed once the dataset is prepared: a folder
#: holding it is an unfinished synthetic write (interrupted), which the next call redoes.
SYNTHETIC_MARKER = ".energon_ray_synthetic"
#: Written once a synthetic dataset is prepared: what it was written with (the writer's parameters and
#: prepare's options), so a later call asking for other data says so instead of using the old data.
SYNTHETIC_RECIPE = ".energon_ray_synthetic.json"

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
    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, num_samples, samples_per_shard)
    jobs = [(out / f"shard_{no:04d}.tar", start, min(samples_per_shard, num_samples - start), image_size, image_format, seed)
            for no, start in enumerate(starts)]  # fmt: skip
    with process_pool(processes) as pool:  # not forked while other threads run
        return list(pool.map(_write_captioning_shard, jobs))


def _write_captioning_shard(job) -> Path:
    path, start, count, image_size, image_format, seed = job
    write_tar(path, captioning_samples(count, image_size, image_format, seed, start=start))
    return path


def text_samples(num_samples: int, start: int = 0) -> List[Tuple[str, Dict[str, bytes]]]:
    """Text-only samples whose ``txt`` is the decimal index (keys ``{index:06d}``)."""
    return [(f"{i:06d}", {"txt": str(i).encode()}) for i in range(start, start + num_samples)]


def synthetic_target(root: Path | str) -> str:
    """What writing a synthetic dataset into ``root`` may do: ``"write"`` (a new or empty folder),
    ``"redo"`` (it holds :data:`SYNTHETIC_MARKER`: an unfinished write of ours) or ``"prepared"``
    (a dataset prepared by energon_ray or Energon, ``.nv-meta/.info.json`` or ``.info.yaml``: use as is).

    Raises:
        DatasetConfigError: ``root`` is not a folder, or holds anything else (named, with a few entries):
            the synthetic data would overwrite or mix with the files there.

    Example:
        >>> import tempfile; synthetic_target(tempfile.mkdtemp() + "/new")
        'write'
    """
    root = Path(root)
    if not root.exists():
        return "write"
    if not root.is_dir():
        raise DatasetConfigError(f"{root}: not a folder; a synthetic dataset is written into a new or empty folder")
    if (root / SYNTHETIC_MARKER).is_file():
        return "redo"
    if already_prepared(root) is not None:
        return "prepared"
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in root.iterdir())
    if not entries:
        return "write"
    shown = ", ".join(entries[:5]) + (f", … ({len(entries)} entries)" if len(entries) > 5 else "")
    raise DatasetConfigError(
        f"{root}: holds {shown} but no prepared dataset (.nv-meta/.info.json); the synthetic data is only "
        "written into a new or empty folder, so nothing was written. To train on your own data, prepare it "
        f"(`energon-ray prepare {root}`) and set dataset.prepare=null; or point dataset.path at a new folder"
    )


def write_synthetic_dataset(
    root: Path | str, write: Callable[[Path], Any], recipe: Optional[Dict[str, Any]] = None, **prepare_options: Any
) -> Path:
    """Write a synthetic dataset with ``write(root)`` and prepare it (``prepare_dataset(root, **prepare_options)``),
    unless ``root`` already holds a prepared dataset, which is used as is (see :func:`synthetic_target`):
    one this function wrote only if it was written with the same ``recipe`` and prepare options
    (recorded in :data:`SYNTHETIC_RECIPE`).

    Args:
        root: the dataset folder; new, empty, prepared, or an unfinished write of this function.
        write: writes the shards under the folder it is given (e.g. ``root/shards``).
        recipe: the parameters ``write`` writes with (JSON-able; e.g. ``{"num_samples": 96}``).
        prepare_options: :func:`energon_ray.format.prepare.prepare_dataset`'s keywords (not ``force_overwrite``).

    Returns:
        ``root``.

    Raises:
        DatasetConfigError: ``root`` holds files of its own (nothing is written), or a synthetic dataset
            written with another recipe (named: what was asked, what is there), or from prepare.

    Example:
        >>> import tempfile; root = Path(tempfile.mkdtemp()) / "captions"
        >>> write = lambda r: write_captioning_dataset(r, 4, 2, image_size=(8, 8))
        >>> opts = dict(split_ratio=(1, 0, 0), sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
        >>> write_synthetic_dataset(root, write, progress=False, **opts) == root, synthetic_target(root)
        (True, 'prepared')
    """
    root = Path(root)
    wanted = _recipe_record(recipe, prepare_options)
    action = synthetic_target(root)
    if action == "prepared":
        _check_recipe(root, wanted)
        return root
    marker = root / SYNTHETIC_MARKER
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text("an unfinished synthetic dataset of energon_ray: the next call writes it again\n")
    write(root)
    # an interrupted prepare may have left its .info.json: ours to overwrite (the marker says so)
    prepare_dataset(root, force_overwrite=action == "redo", **prepare_options)
    (root / SYNTHETIC_RECIPE).write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    marker.unlink()
    return root


def _recipe_record(recipe: Optional[Dict[str, Any]], prepare_options: Dict[str, Any]) -> Dict[str, Any]:
    """What a synthetic dataset is written with, as JSON reads it back (tuples as lists); prepare's
    ``progress`` left out (it changes no byte)."""
    options = {k: v for k, v in prepare_options.items() if k != "progress"}
    return json.loads(json.dumps({"recipe": dict(recipe or {}), "prepare": options}, default=repr))


def _check_recipe(root: Path, wanted: Dict[str, Any]) -> None:
    """Refuse a prepared synthetic dataset written with other parameters than ``wanted`` (a prepared
    folder without :data:`SYNTHETIC_RECIPE`, a user's own or written before it, is used as is)."""
    path = root / SYNTHETIC_RECIPE
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise DatasetConfigError(f"{path}: unreadable ({exc}); delete it to use {root} as it is") from None
    if found == wanted:
        return
    changed = []
    for part in ("recipe", "prepare"):
        had, asked = found.get(part, {}), wanted[part]
        for key in sorted(set(had) | set(asked)):
            if had.get(key) != asked.get(key):
                changed.append(f"{key} was {_shown(had, key)}, is now {_shown(asked, key)}")
    raise DatasetConfigError(
        f"{root}: holds a synthetic dataset written with other parameters ({'; '.join(changed)}), so it "
        "was not used. It holds only what energon_ray generated: delete the folder to write it again with "
        "the new parameters, or point the dataset path at a new folder"
    )


def _shown(values: Dict[str, Any], key: str) -> str:
    return json.dumps(values[key]) if key in values else "unset"
