"""Exceptions and the per-sample error policy's handlers.

Energon's vocabulary: a hook raises :class:`SkipSample` (the docs call it ``IgnoreSample``) to drop a
sample on purpose; any other exception is a data error that is logged, counted and skipped until too
many happen in a row, which raises :class:`FatalSampleError`.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, Optional, Sequence

logger = logging.getLogger("energon_ray")


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
    NameError,
    UnboundLocalError,
    FatalSampleError,
)


def log_exception(exc: BaseException, sample: Any = None, sources: Optional[Sequence[Any]] = None) -> None:
    """Default error handler: log the failure with its sources; the sample is then skipped."""
    where = ", ".join(str(s) for s in sources) if sources else "unknown source"
    logger.warning(
        "Skipping sample from %s: %s: %s\n%s",
        where,
        type(exc).__name__,
        exc,
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)),
    )


def reraise_exception(exc: BaseException, sample: Any = None, sources: Optional[Sequence[Any]] = None) -> None:
    """Error handler that aborts loading by re-raising the exception."""
    raise exc
