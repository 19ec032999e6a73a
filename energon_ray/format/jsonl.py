"""JSONL datasets: one JSON object per line, ``<name>.jsonl.idx`` holding count+1 line offsets.

They are always crude (each sample is ``{"json": …}`` with the line index as key, cooked by the
task encoder's cookers); split parts do not apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from tqdm import tqdm

from energon_ray.errors import DatasetConfigError
from energon_ray.format.tar_index import check_tar_index, read_tar_index, write_tar_index
from energon_ray.storage import as_path, settings_of

JSONL_CONFIG = "<jsonl>"


def is_jsonl(path) -> bool:
    """A ``.jsonl`` file."""
    return str(path).endswith(".jsonl") and as_path(path).is_file()


def prepare_jsonl(path: Path | str, progress: bool = True) -> int:
    """Index a JSONL file: write ``<path>.idx`` with the byte offset of every line plus the end.

    Returns:
        The number of samples (non-empty lines).

    Raises:
        DatasetConfigError: if the file is missing or empty, or a line is not a JSON object (does
            not start with ``{`` and end with ``}``, as Energon's prepare checks), naming the line.
    """
    path = as_path(path)
    if not path.is_file():
        raise DatasetConfigError(f"{path}: JSONL file does not exist")
    offsets: List[int] = []
    position = 0
    with path.open("rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, disable=not progress, desc="Indexing") as bar:
        for number, line in enumerate(f, start=1):
            if line.strip():
                _check_object_line(path, number, line)
                offsets.append(position)
            position += len(line)
            bar.update(len(line))
    if not offsets:
        raise DatasetConfigError(f"{path}: JSONL file has no samples")
    write_tar_index(path, offsets + [position])
    return len(offsets)


def _check_object_line(path, number: int, line: bytes) -> None:
    """Each sample is one JSON object: a line that is no ``{…}`` is refused, naming it."""
    stripped = line.strip()
    if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
        shown = stripped[:60] + (b"..." if len(stripped) > 60 else b"")
        raise DatasetConfigError(
            f"{path}: line {number} is not a JSON object (a line must start with '{{' and end with '}}'): {shown!r}"
        )


def open_jsonl(path: Path | str, split_part: str = "train"):
    """A ``PreparedDataset`` over a prepared JSONL file (the split part is ignored, as in Energon)."""
    from energon_ray.format.dataset import PreparedDataset, ShardInfo

    path = as_path(path)
    offsets = read_tar_index(path)
    count = len(offsets) - 1
    check_tar_index(path, offsets, count)
    return PreparedDataset(
        root=str(path),
        split_part=split_part,
        shards=(ShardInfo(name=path.name, path=str(path), count=count),),
        sample_excludes=frozenset(),
        spec=jsonl_spec(str(path)),
        split_config="",
        dataset_config=JSONL_CONFIG,
        format="jsonl",
        storage=settings_of(path),
    )


def jsonl_spec(path: str):
    """The dataset spec of a JSONL file: crude samples with one ``json`` part."""
    from energon_ray.format.dataset_yaml import DatasetSpec
    from energon_ray.samples import CrudeSample

    return DatasetSpec(file=path, root=path, dataset_config=JSONL_CONFIG, sample_type=CrudeSample)
