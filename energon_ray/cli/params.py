"""What the CLI's commands (and ``jobs/prepare_job.py``) share about their arguments: dataset paths
(local, or ``s3://``/``msc://`` where a command reads remote datasets), the library's errors as clean
``Error: …`` messages, and ``prepare``'s option values checked (ratio, split parts, sample type,
field map)."""

from __future__ import annotations

import contextlib
import difflib
import json
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import click

from energon_ray.errors import DatasetConfigError
from energon_ray.format.prepare import CRUDE
from energon_ray.format.split import check_ratio
from energon_ray.samples import SAMPLE_TYPES
from energon_ray.storage import as_path, is_remote, local_of

#: how ``--workers``' default is shown
WORKERS_SHOWN = "one per CPU, at most 16"


def _local(value: Any) -> Any:
    """``msc://__filesystem__/p`` (multi-storage-client's local profile) as the local ``/p``; else ``value``."""
    return (local_of(value) or value) if isinstance(value, str) else value


class DatasetLocation(click.ParamType):
    """A local path that must exist, or an ``s3://``/``msc://`` URL (checked when it is read)."""

    name = "path"

    def __init__(self, file_okay: bool = True):
        self.local = click.Path(exists=True, file_okay=file_okay, path_type=Path)

    def convert(self, value, param, ctx):
        if not is_remote(value):
            return self.local.convert(_local(value), param, ctx)
        try:
            return as_path(value)
        except (ValueError, OSError) as exc:
            self.fail(str(exc), param, ctx)


class LocalDatasetPath(click.ParamType):
    """A local path that must exist; an ``s3://``/``msc://`` URL is refused as such (``click.Path`` would
    call it a path that does not exist, as if the bucket or key were wrong)."""

    name = "path"

    def __init__(self, command: str):
        self.command = command
        self.local = click.Path(exists=True, path_type=Path)

    def convert(self, value, param, ctx):
        if is_remote(value):
            self.fail(
                f"{value}: `energon-ray {self.command}` reads local datasets only (`info` and `prepare` take "
                f"s3:// and msc:// URLs); copy the dataset to a local folder to {self.command} it", param, ctx,
            )  # fmt: skip
        return self.local.convert(_local(value), param, ctx)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's validation errors into a clean ``Error: …`` message with exit code 1."""
    try:
        yield
    except (DatasetConfigError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def ratio_numbers(value: str) -> List[float]:
    """A ``train,val,test`` ratio, checked whole (shared with ``jobs/prepare_job.py``).

    Raises:
        ValueError: not numbers, or not a ratio (``format.split.check_ratio``).
    """
    try:
        numbers = [float(x) for x in value.split(",")]
    except ValueError:
        raise ValueError(f"expected numbers like '8,1,1' or '0.8,0.1,0.1', got {value!r}") from None
    return list(check_ratio(numbers))


def raising(check: Callable[[str], Any], error: Callable[[str], Exception]) -> Callable[[str], Any]:
    """``check`` (one of the checks here) with its ``ValueError`` raised as ``error`` (click's
    ``BadParameter``; argparse's ``ArgumentTypeError`` in ``jobs/prepare_job.py``)."""

    def convert(value: str) -> Any:
        try:
            return check(value)
        except ValueError as exc:
            raise error(str(exc)) from None

    return convert


def _for_click(check: Callable[[str], Any]) -> Callable[[str], Any]:
    return raising(check, click.BadParameter)


def ratio_value(value: str) -> List[float]:
    """``ratio_numbers`` for click (the prompt asks again for any bad one)."""
    return _for_click(ratio_numbers)(value)


def split_part_value(value: str) -> Tuple[str, str]:
    """A ``--split-parts`` value, ``name:regex`` (shared with ``jobs/prepare_job.py``).

    Raises:
        ValueError: not of that form.
    """
    name, sep, pattern = value.partition(":")
    if not sep or not name or not pattern:
        raise ValueError(f"expected 'name:regex' like 'train:shards/train_.*', got {value!r}")
    return name, pattern


def parse_ratio(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[List[float]]:
    return None if value is None else ratio_value(value)


def parse_split_parts(
    ctx: click.Context, param: click.Parameter, values: Tuple[str, ...]
) -> Optional[Dict[str, List[str]]]:
    if not values:
        return None
    parts: Dict[str, List[str]] = {}
    for value in values:
        name, pattern = _for_click(split_part_value)(value)
        parts.setdefault(name, []).append(pattern)
    return parts


def sample_type_value(value: Optional[str]) -> Optional[str]:
    """``--sample-type``'s value checked (shared with ``jobs/prepare_job.py``).

    Raises:
        ValueError: not a sample type's name (with the closest one and the known ones).
    """
    names = sorted(SAMPLE_TYPES) + [CRUDE]
    if value is None or value in names:
        return value
    close = difflib.get_close_matches(value, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown sample type {value!r}{hint}; known: {', '.join(names)}")


def parse_sample_type(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    return _for_click(sample_type_value)(value)


def field_map_value(value: str) -> dict:
    """``--field-map``'s JSON object (shared with ``jobs/prepare_job.py``).

    Raises:
        ValueError: not JSON, or not an object.
    """
    try:
        field_map = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc}): {value!r}") from None
    if not isinstance(field_map, dict):
        raise ValueError(f'expected a JSON object like \'{{"image": "jpg"}}\', got {value!r}')
    return field_map


def parse_field_map(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[dict]:
    return None if value is None else _for_click(field_map_value)(value)
