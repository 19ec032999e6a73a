"""Checks of the jobs/ scripts' options and YAML configs, so a bad one stops the job at once with a
usage error that names the option or the file, the key and the value (never a traceback from deep
inside a run).

Example:
    >>> positive_int("3")
    3
    >>> check_value("loader.batch_size", "abc", positive)
    "loader.batch_size must be an integer >= 1, got 'abc'"
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import yaml

#: What is wrong with a value (``"an integer >= 1"``), or None when it is fine.
Check = Callable[[Any], Optional[str]]
#: A config's layout: top-level keys, each a value's check or a section (a mapping of key -> check).
Schema = Mapping[str, Union[Check, Mapping[str, Check]]]


class JobConfigError(ValueError):
    """A job's YAML config cannot be used; the message names the file, the key and the value."""


def positive_int(text: str) -> int:
    """``argparse`` ``type=`` for a count: an integer >= 1 (``0`` or ``-2`` is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive(value: Any) -> Optional[str]:
    """An integer >= 1."""
    return None if _is_int(value) and value >= 1 else "an integer >= 1"


def non_negative(value: Any) -> Optional[str]:
    """An integer >= 0."""
    return None if _is_int(value) and value >= 0 else "an integer >= 0"


def boolean(value: Any) -> Optional[str]:
    """``true`` or ``false``."""
    return None if isinstance(value, bool) else "true or false"


def text(value: Any) -> Optional[str]:
    """A non-empty string."""
    return None if isinstance(value, str) and value else "a non-empty string"


def positive_pair(value: Any) -> Optional[str]:
    """Two integers >= 1, like ``[320, 240]``."""
    ok = isinstance(value, list) and len(value) == 2 and all(positive(v) is None for v in value)
    return None if ok else "two integers >= 1, like [320, 240]"


def optional(check: Check) -> Check:
    """``check``, or ``null``."""

    def allow_null(value: Any) -> Optional[str]:
        wrong = check(value)
        return None if value is None or wrong is None else f"{wrong} or null"

    return allow_null


def check_value(key: str, value: Any, check: Check) -> Optional[str]:
    """``"<key> must be <what>, got <value>"``, or None when ``value`` passes ``check``."""
    wrong = check(value)
    return None if wrong is None else f"{key} must be {wrong}, got {value!r}"


def _unknown(key: str, where: str, known: List[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {where}{key}{hint}; the known keys{' of ' + where[:-1] if where else ''} are {', '.join(known)}"


def _check_mapping(values: Mapping, schema: Mapping[str, Check], where: str) -> List[str]:
    """The problems of one mapping: unknown keys (with the closest known one), missing keys, bad values."""
    known = list(schema)
    problems = [_unknown(str(key), where, known) for key in values if key not in schema]
    for key, check in schema.items():
        if key not in values:
            section = f"section {where}{key} (with {', '.join(check)})" if isinstance(check, Mapping) else f"{where}{key}"
            problems.append(f"{section} is missing")
        elif isinstance(check, Mapping):
            if isinstance(values[key], Mapping):
                problems += _check_mapping(values[key], check, f"{where}{key}.")
            else:
                problems.append(f"section {where}{key} must be a mapping of {', '.join(check)}, got {values[key]!r}")
        else:
            problems += filter(None, [check_value(f"{where}{key}", values[key], check)])
    return problems


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the
    last value silently, so ``batch_size: 8`` further down would override an earlier one unnoticed)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"key {key!r} appears twice", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as stream:  # the stream's name goes into PyYAML's marks
            return yaml.load(stream, Loader=_UniqueKeyLoader)
    except OSError as exc:
        raise JobConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark, start = exc.problem_mark or exc.context_mark, exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = exc.context and (f"{exc.context} (from line {start.line + 1}, column {start.column + 1})" if start else exc.context)
        what = ", ".join(part for part in (context, exc.problem) if part)
        raise JobConfigError(f"{path}{where}: not valid YAML: {what}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise JobConfigError(f"{path}: not valid YAML: {exc}") from None


def read_config(path: Union[str, Path], schema: Schema) -> Dict[str, Any]:
    """The YAML mapping in ``path``, with every key of ``schema`` present, none other, each value passing its check.

    Raises:
        JobConfigError: the file is missing or unreadable, not YAML, empty or not a mapping, or has
            unknown (with the closest known key), missing or bad keys; every problem of the file, one a line.

    Example:
        >>> import tempfile
        >>> cfg = Path(tempfile.mkdtemp()) / "job.yaml"
        >>> _ = cfg.write_text("loader: {batch_sise: 4}")
        >>> read_config(cfg, {"loader": {"batch_size": positive}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        energon_ray.tasks.job_args.JobConfigError: .../job.yaml: unknown key loader.batch_sise (did you mean 'batch_size'?); ...
    """
    path = Path(path)
    config = _load(path)
    if not isinstance(config, dict):
        got = "an empty file" if config is None else f"{config!r}"
        raise JobConfigError(f"{path}: expected a mapping of {', '.join(schema)}, got {got}")
    problems = _check_mapping(config, schema, "")
    if problems:
        raise JobConfigError(f"{path}: " + f"\n{path}: ".join(problems))
    return config
