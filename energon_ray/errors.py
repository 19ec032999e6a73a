"""Exceptions and the per-sample error policy's handlers.

Energon's vocabulary: a hook raises :class:`SkipSample` (the docs call it ``IgnoreSample``) to drop a
sample on purpose; any other exception is a data error that is logged, counted and skipped until too
many happen in a row, which raises :class:`FatalSampleError`.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any, Optional, Sequence

logger = logging.getLogger("energon_ray")


def parse_problem(exc: BaseException) -> str:
    """A YAML or JSON parse error on one line: ``line L, column C: what`` (PyYAML's own text spans
    several lines and names ``<unicode string>`` instead of the file).

    Example:
        >>> import yaml
        >>> try:
        ...     yaml.safe_load("a: [1")
        ... except yaml.YAMLError as exc:
        ...     parse_problem(exc)
        "line 1, column 6: while parsing a flow sequence (from line 1, column 4), expected ',' or ']', but got '<stream end>'"
    """
    mark, start = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem, context = getattr(exc, "problem", None), getattr(exc, "context", None)
    if problem is None and context is None:  # not a marked YAML error (JSON's message is one line already)
        return " ".join(str(exc).split())
    mark = mark or start
    if context and start is not None:
        context = f"{context} (from line {start.line + 1}, column {start.column + 1})"
    what = ", ".join(part for part in (context, problem) if part)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


class SkipSample(Exception):
    """Raise inside a task-encoder hook to drop the current sample (or batch) without an error."""


#: The name Energon's documentation uses; it is the very same exception.
IgnoreSample = SkipSample


class SampleException(ValueError):
    """A sample could not be loaded; the message names the shard, the sample key and the field."""


class FatalSampleError(RuntimeError):
    """Too many consecutive sample failures, a system error inside a hook, or a handler that aborted."""


class DatasetConfigError(ValueError):
    """A dataset, split or configuration file is missing or inconsistent (raised before any Ray task)."""


class ShardReadError(IOError):
    """A tar shard cannot be read at the offset its ``.tar.idx`` promises (truncated or corrupt)."""


#: Exceptions that are never skipped: they mean a bug or a broken environment, not a bad sample.
SYSTEM_EXCEPTIONS: tuple[type[BaseException], ...] = (
    SystemError,
    SyntaxError,
    ImportError,
    StopIteration,
    StopAsyncIteration,
    MemoryError,
    RecursionError,
    ReferenceError,
    NameError,
    UnboundLocalError,
    FatalSampleError,
)


def log_exception(exc: BaseException, sample: Any = None, sources: Optional[Sequence[Any]] = None) -> None:
    """Default error handler: log the failure with its sources and the sample that failed (its
    key and each field in short, as Energon prints it); the sample is then skipped."""
    where = ", ".join(str(s) for s in sources) if sources else "unknown source"
    logger.warning(
        "Skipping sample from %s: %s: %s\n%s%s",
        where,
        type(exc).__name__,
        exc,
        describe_sample(sample),
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)),
    )


#: Longest text of one field in :func:`describe_sample`.
FIELD_TEXT = 80


def _short_value(value: Any) -> str:
    """A tensor or array as type, dtype and shape; bytes as their length; else a truncated repr."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} {str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes[{len(value)}]"
    text = repr(value)
    return text if len(text) <= FIELD_TEXT else text[: FIELD_TEXT - 1] + "…"


def _fields(sample: Any) -> Optional[list]:
    """``(name, value)`` of a sample's fields (a dict's items, a dataclass's fields), else None."""
    if isinstance(sample, dict):
        return list(sample.items())
    names = getattr(sample, "__dataclass_fields__", None)
    if names is None or isinstance(sample, type):
        return None
    return [(name, getattr(sample, name, None)) for name in names]


def describe_sample(sample: Any) -> str:
    """Lines naming what an error handler got: each field of a sample (or of each sample of a list),
    one per line; empty for ``None``.

    Example:
        >>> print(describe_sample({"__key__": "s1", "caption": "a cat", "jpg": b"abc"}), end="")
        sample:
          __key__: 's1'
          caption: 'a cat'
          jpg: bytes[3]
    """
    if sample is None:
        return ""
    items = sample if isinstance(sample, (list, tuple)) and sample and all(_fields(s) is not None for s in sample) else [sample]
    lines = []
    for i, item in enumerate(items):
        lines.append("sample:" if len(items) == 1 else f"sample {i} of {len(items)}:")
        fields = _fields(item)
        if fields is None:
            lines.append(f"  {_short_value(item)}")
        else:
            lines += [f"  {name}: {_short_value(value)}" for name, value in fields]
    return "\n".join(lines) + "\n"


class RemoteTraceback(Exception):
    """Where a hook failed in its Ray task, as text: the ``__cause__`` of the exception the loader
    hands the user's error handler (an exception crosses processes without its traceback)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


def with_remote_traceback(exc: BaseException, text: str) -> BaseException:
    """``exc`` caused by its Ray task's traceback ``text`` (none: ``exc`` as it is)."""
    if text and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(text)
    return exc


def reraise_exception(exc: BaseException, sample: Any = None, sources: Optional[Sequence[Any]] = None) -> None:
    """Error handler that aborts loading by re-raising the exception."""
    raise exc


class UntrustedCodeError(DatasetConfigError):
    """A dataset asks to run code (a Python module, a pickle, a class outside energon_ray) and the user
    did not opt in with ``trust_dataset_code=True`` (or ``ENERGON_RAY_TRUST_DATASET_CODE=1``)."""


#: Refused dataset code is never a bad sample to skip: loading stops with the opt-in in the message.
SYSTEM_EXCEPTIONS = SYSTEM_EXCEPTIONS + (UntrustedCodeError,)

#: Environment variable that trusts every dataset of a job (``1``/``true``/``yes``).
TRUST_ENV = "ENERGON_RAY_TRUST_DATASET_CODE"


def resolve_trust(trust_dataset_code: Optional[bool] = None) -> bool:
    """The effective opt-in: an explicit ``trust_dataset_code`` wins, else ``ENERGON_RAY_TRUST_DATASET_CODE``."""
    import os

    if trust_dataset_code is not None:
        if not isinstance(trust_dataset_code, bool):
            raise TypeError(f"trust_dataset_code must be a bool or None, got {trust_dataset_code!r}")
        return trust_dataset_code
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def untrusted(what: str, where: str) -> UntrustedCodeError:
    """The error for code a dataset would run: ``what`` (e.g. ``part 'x.pyd' of sample k``), ``where`` (the dataset)."""
    return UntrustedCodeError(
        f"{where}: refusing to run code the dataset brings ({what}); datasets run no code unless you opt "
        f"in: pass trust_dataset_code=True to get_train_dataset/get_val_dataset (or set {TRUST_ENV}=1 "
        "for the whole job) if you trust this dataset"
    )


#: per kind of notice, the keys given it in this process (``first_time``)
_NOTICED: dict = {}


def first_time(kind: str, key: Any) -> bool:
    """Whether ``key`` gets its ``kind`` of warning now: ``True`` once per process, then ``False``
    (configs are read again in every Ray worker; a notice is given once where it is read first).

    Example:
        >>> first_time("doc example", 1), first_time("doc example", 1)
        (True, False)
    """
    keys = _NOTICED.setdefault(kind, set())
    if key in keys:
        return False
    keys.add(key)
    return True


def noticed(kind: str) -> frozenset:
    """The keys given a ``kind`` of warning in this process so far (``first_time``)."""
    return frozenset(_NOTICED.get(kind, ()))


def users_stacklevel() -> int:
    """The ``stacklevel`` for a warning its caller gives that points at the first frame outside
    energon_ray: the user's line that called into the package, whatever the calls in between."""
    import sys

    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("energon_ray."):
        level, frame = level + 1, frame.f_back
    return level


def check_keywords(where: str, kwargs: dict, energon_only: Sequence[str]) -> None:
    """Keywords Energon accepts and we do not need are warned about once each; any other raises.

    Raises:
        TypeError: naming ``where`` and the unknown keyword(s) (a misspelling must not pass silently).
    """
    unknown = sorted(k for k in kwargs if k not in energon_only)
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {unknown}")
    for key in sorted(kwargs):
        if first_time("ignored keyword", (where, key)):
            logger.warning("%s(): %s= is a megatron.energon option that energon_ray does not need; ignored", where, key)


class MediaTooLargeError(SampleException):
    """An image, video or audio part whose header promises more pixels or a longer duration than the
    decoder allows, or a part over ``SampleDecoder(max_part_bytes=...)`` (a ``.gz`` part inflating past
    it, a ``json``/``npy``/… part larger); it is refused before decoding (a counted skip under the
    per-sample error policy)."""


class IndexMismatchError(ShardReadError):
    """A shard's ``.tar.idx`` does not match its tar (an offset misses the tar headers): re-run prepare."""


class ExecutionLost(RuntimeError):
    """Ray lost an execution of the loader's segments (its feeder actor, a node, or objects no retry
    could rebuild); the loader restarts it from its worker streams' checkpoints."""


_OUR_ERRORS = (FatalSampleError, ShardReadError, DatasetConfigError, SampleException)
_ERROR_LINE = re.compile(r"energon_ray\.errors\.(FatalSampleError|ShardReadError|DatasetConfigError|SampleException): (.*)")


def unwrap_error(exc: BaseException) -> Optional[BaseException]:
    """Our exception behind Ray's wrappers: the object if Ray kept it, else rebuilt from the text."""
    seen, stack = set(), [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _OUR_ERRORS) and current is not exc:
            return type(current)(str(current))
        stack.extend([getattr(current, "cause", None), current.__cause__, current.__context__])
    matches = _ERROR_LINE.findall(str(exc))
    if matches:
        name, message = matches[-1]
        return {e.__name__: e for e in _OUR_ERRORS}[name](message)
    return None
