"""``energon-ray preview PATH``: the first samples of a prepared dataset, field by field, and their images."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import click
import numpy as np
import PIL.Image
import torch

from energon_ray.cli.gallery import PreviewItem, find_images, write_output
from energon_ray.cli.local_read import (
    LocalDataset, Problem, SampleChecker, ShardSamples, check_path_options, config_file_options, open_local, printable,
    split_parts_option,
)  # fmt: skip
from energon_ray.cli.params import LocalDatasetPath, user_errors
from energon_ray.decode.sample_decoder import IMAGE_MODES, SampleDecoder
from energon_ray.errors import ShardReadError, resolve_trust
from energon_ray.format.tar_index import check_tar_index

#: Longest repr of a value in the printed listing (HTML captions show strings up to ``HTML_WIDTH``).
WIDTH = 70
HTML_WIDTH = 2000


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(value: Any, width: int = WIDTH) -> str:
    """Type and shape/dtype of a tensor or array, type and a truncated repr of anything else.

    Example:
        >>> describe(torch.zeros(3, 48, 64))
        'Tensor float32 [3, 48, 64]'
        >>> describe("a cat on a sofa")
        "str 'a cat on a sofa'"
    """
    if isinstance(value, torch.Tensor):
        return f"Tensor {str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {list(value.shape)}"
    if isinstance(value, PIL.Image.Image):
        return f"PIL.Image {value.mode} {value.width}x{value.height}"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes[{len(value)}] {_short(repr(bytes(value[:width])), width)}"
    if isinstance(value, (list, tuple)):
        name = type(value).__name__
        if value and isinstance(value[0], (torch.Tensor, np.ndarray, PIL.Image.Image)):
            return f"{name}[{len(value)}], first: {describe(value[0], width)}"
        return f"{name}[{len(value)}] {_short(repr(value), width)}"
    if isinstance(value, dict):
        return f"dict[{len(value)}] {_short(repr(value), width)}"
    if value is None:
        return "None"
    return f"{type(value).__name__} {_short(repr(value), width)}"


def sample_fields(sample: Any) -> List[Tuple[str, Any]]:
    """``(name, value)`` of a sample's data fields (not ``__key__`` and the other meta fields)."""
    if isinstance(sample, dict):
        items = list(sample.items())
    else:
        items = [(f.name, getattr(sample, f.name, None)) for f in dataclasses.fields(sample)]
    return [(name, value) for name, value in items if not name.startswith("__")]


def iter_first(dataset: LocalDataset, count: int, checker: SampleChecker) -> Iterator[Tuple[str, str, Any, List[Problem]]]:
    """``(shard, key, sample or None, problems)`` of the first ``count`` samples not excluded, in shard order.

    Raises:
        DatasetConfigError: a shard's ``.tar.idx`` is missing or does not match its tar.
    """
    left = count
    for shard in dataset.shards:
        if left <= 0:
            return
        if shard.info.count == len(shard.excluded):
            continue
        samples = ShardSamples(dataset, shard)
        try:
            check_tar_index(shard.info.path, samples.reader.offsets, shard.info.count)
            for index in range(shard.info.count):
                if left <= 0:
                    break
                if index in shard.excluded:
                    continue
                left -= 1
                try:
                    raw = samples.raw(index)
                except ShardReadError as exc:
                    yield shard.info.name, samples.key(index), None, [Problem(shard.info.name, samples.key(index), "-", str(exc))]
                    continue
                sample, problems = checker.load(raw)
                yield shard.info.name, raw["__key__"], sample, problems
        finally:
            samples.close()


def _lines(sample: Any, problems: List[Problem], width: int) -> List[Tuple[str, str]]:
    """One ``(field, text)`` per field; strings in full up to ``width`` when ``width > WIDTH`` (HTML)."""
    if sample is None:
        return [(p.field, f"ERROR: {p.reason}") for p in problems]
    return [
        (name, _short(value, width) if isinstance(value, str) and width > WIDTH else describe(value, width))
        for name, value in sample_fields(sample)
    ]


def _item(shard: str, key: str, sample: Any, problems: List[Problem], width: int) -> PreviewItem:
    images = [img for name, value in (sample_fields(sample) if sample is not None else []) for img in find_images(name, value, key)]
    return PreviewItem(key=key, shard=shard, images=images, lines=_lines(sample, problems, width))


@click.command(name="preview")
@click.argument("path", type=LocalDatasetPath("preview"))
@click.option("--split-part", "--split-parts", "split_parts", default="train", show_default=True,
              callback=split_parts_option,
              help="Split part to read, or a comma list (as Energon's --split-parts): the first samples of each "
              "in turn; all: every part as one; ignored for .jsonl.")  # fmt: skip
@config_file_options
@click.option("-n", "--num-samples", "count", type=click.IntRange(min=1), default=8, show_default=True,
              help="How many samples, from the first shard on.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also write the samples' images: FILE.png (a grid) or FILE.html (images and captions).")
@click.option("--columns", type=click.IntRange(min=1), default=4, show_default=True, help="Images per row of a PNG grid.")
@click.option("--thumb-size", type=click.IntRange(min=16), default=128, show_default=True,
              help="Side of a PNG grid cell in pixels.")
@click.option("--image-decode", type=click.Choice(IMAGE_MODES), default="torchrgb", show_default=True,
              help="How images are decoded (the SampleDecoder's image_decode).")
@click.option("--trust-dataset-code", is_flag=True,
              help="Run the code the dataset brings (sample_loader.py, part_filter, pickled parts).")
def preview_command(
    path: Path, split_parts: Tuple[str, ...], split_config: str, dataset_config: str, count: int, out: Optional[Path],
    columns: int, thumb_size: int, image_decode: str, trust_dataset_code: bool,
) -> None:  # fmt: skip
    """Print the first samples of the prepared dataset (or .jsonl file) at PATH: per sample its key and
    every field's type and shape (tensors) or value; with --out, also draw their images.

    Samples are read and decoded here, as the loader would (no Ray). The dataset runs no code unless
    --trust-dataset-code (or ENERGON_RAY_TRUST_DATASET_CODE=1).

    \b
    energon-ray preview ./ds -n 8 --out samples.png
    """
    if out is not None and out.suffix.lower() not in (".png", ".html", ".htm"):
        raise click.BadParameter(f"expected a .png or .html file, got {out}", param_hint="--out")
    if out is not None and not out.resolve().parent.is_dir():  # found now, not after reading every sample
        raise click.BadParameter(f"folder {out.resolve().parent} does not exist", param_hint="--out")
    check_path_options(path, split_config, dataset_config)
    trusted = resolve_trust(True if trust_dataset_code else None)
    width = HTML_WIDTH if out is not None and out.suffix.lower() != ".png" else WIDTH
    items: List[PreviewItem] = []
    bad = shown = 0
    with user_errors():
        configs = dict(split_config=split_config, dataset_config=dataset_config)
        whole = open_local(path, split_parts, trusted, **configs)  # every part checked before any is read
        for part in split_parts if path.suffix != ".jsonl" else split_parts[:1]:  # as Energon's: part by part
            if part in whole.empty_parts:
                click.echo(f"Skipping empty split part {part}")
                continue
            dataset = whole if len(split_parts) == 1 else open_local(path, part, trusted, **configs)
            checker = SampleChecker(dataset.spec, SampleDecoder(image_decode=image_decode, trust_dataset_code=trusted))
            click.echo(f"Dataset {dataset.describe()}")
            for n, (shard, key, sample, problems) in enumerate(iter_first(dataset, count, checker)):
                bad += sample is None
                shown += 1
                click.echo(printable(f"[{n}] {key}  ({shard})"))
                for field, text in _lines(sample, problems, WIDTH):
                    click.echo(printable(f"  {field}: {text}"))
                if out is not None:
                    items.append(_item(shard, key, sample, problems, width))
    if bad:
        click.echo(f"{bad} of {shown} samples could not be loaded; `energon-ray lint {path}` checks them all.", err=True)
    if out is not None:
        try:
            click.echo(write_output(items, out, f"energon-ray preview: {whole.describe()}", columns, thumb_size))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
