"""Our own retry loop for object store requests, and the per-process request counters.

Each backend turns its client's exceptions into one of four kinds (transient, missing, denied,
fatal); transient ones are retried with capped exponential backoff and counted, so a segment's
report can tell how many retries its reads needed. The store's own client never retries on its own
(it would hide them from the counters).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import time
from typing import Callable, Optional, Tuple, TypeVar

from energon_ray.storage.errors import (
    AccessDeniedError, BucketNotFoundError, ObjectNotFoundError, StorageError, StorageUnavailableError, redact,
)  # fmt: skip

logger = logging.getLogger("energon_ray.storage")

T = TypeVar("T")

TRANSIENT, MISSING, DENIED, FATAL = "transient", "missing", "denied", "fatal"
#: the kind of a missing bucket (a ``MISSING`` the caller must not take for an absent file)
NO_BUCKET = "no bucket"

#: Environment variables (besides AWS_MAX_ATTEMPTS) that tune the retry loop.
BACKOFF_ENV = "ENERGON_RAY_STORAGE_BACKOFF_S"
MAX_BACKOFF_ENV = "ENERGON_RAY_STORAGE_MAX_BACKOFF_S"
#: failures in a row of one request after which its retries are logged as a warning (once)
_SAY_AFTER = 3


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient failure is retried.

    Attempt ``k`` (0-based) that failed waits ``min(max_delay, base_delay * 2**k)`` times a random
    factor in [0.5, 1] before the next one; after ``max_attempts`` attempts the error is raised.
    """

    max_attempts: int = 10
    base_delay: float = 0.1
    max_delay: float = 10.0

    @classmethod
    def from_environment(cls) -> "RetryPolicy":
        """``AWS_MAX_ATTEMPTS`` (the standard variable), ``ENERGON_RAY_STORAGE_BACKOFF_S`` and
        ``ENERGON_RAY_STORAGE_MAX_BACKOFF_S``; defaults for the ones not set.

        Raises:
            ValueError: a value that is not a positive number, naming the variable.
        """
        out = cls()
        for env, name, kind in (("AWS_MAX_ATTEMPTS", "max_attempts", int), (BACKOFF_ENV, "base_delay", float),
                                (MAX_BACKOFF_ENV, "max_delay", float)):  # fmt: skip
            raw = os.environ.get(env)
            if raw is None or raw == "":
                continue
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{env}={raw!r} is not a valid {kind.__name__}") from None
            if value < (1 if kind is int else 0):
                raise ValueError(f"{env}={raw!r} must be {'>= 1' if kind is int else '>= 0'}")
            out = dataclasses.replace(out, **{name: value})
        return out

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based)."""
        return min(self.max_delay, self.base_delay * (2 ** min(attempt, 30))) * random.uniform(0.5, 1.0)


class IOStats:
    """Requests, bytes and retries of this process's object store reads (thread-safe counters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.retries = 0

    def add(self, requests: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.retries += retries

    def snapshot(self) -> Tuple[int, int, int]:
        """``(requests, bytes, retries)`` so far."""
        with self._lock:
            return self.requests, self.bytes, self.retries


#: The counters of this process (a Ray worker's segment reads take their difference).
STATS = IOStats()

Classifier = Callable[[BaseException], Tuple[str, str]]


def call(
    operation: Callable[[], T],
    *,
    url: str,
    what: str,
    policy: RetryPolicy,
    classify: Classifier,
    size_of: Optional[Callable[[T], int]] = None,
) -> T:
    """Run ``operation`` until it succeeds, retrying transient failures; count every attempt.

    Args:
        operation: one request (including reading its body, so a connection dropped mid-body is retried).
        url: the object, for messages.
        what: the request in words (``"read bytes [0, 512)"``), for messages.
        policy: attempts and backoff.
        classify: ``exception -> (kind, short description)``; kinds are TRANSIENT, MISSING, DENIED, FATAL.
        size_of: bytes a result holds (counted as bytes read).

    Raises:
        ObjectNotFoundError, AccessDeniedError, StorageUnavailableError, StorageError: naming ``url``.
    """
    attempt = 0
    while True:
        try:
            result = operation()
        except StorageError:
            STATS.add(requests=1)
            raise
        except Exception as exc:  # classified below; unknown ones are fatal
            STATS.add(requests=1)
            kind, description = classify(exc)
            description = redact(description)
            if kind == TRANSIENT and attempt + 1 < policy.max_attempts:
                delay = policy.delay(attempt)
                # a blip stays quiet; a store that keeps failing (down, or a wrong endpoint) is said once,
                # as the retries up to AWS_MAX_ATTEMPTS can take half a minute
                log = logger.warning if attempt + 1 == _SAY_AFTER else logger.info
                log("%s: %s failed (%s); retry %d of %d in %.2fs", url, what, description, attempt + 1,
                    policy.max_attempts - 1, delay)  # fmt: skip
                STATS.add(retries=1)
                attempt += 1
                time.sleep(delay)
                continue
            if kind == NO_BUCKET:
                raise BucketNotFoundError(url, f"no such bucket ({description})") from None
            if kind == MISSING:
                raise ObjectNotFoundError(url, f"no such object ({description})") from None
            if kind == DENIED:
                raise AccessDeniedError(
                    url, f"access denied ({description}); check the credentials and the permissions on this location"
                ) from None
            if kind == TRANSIENT:
                raise StorageUnavailableError(
                    url, f"{what} failed {attempt + 1} times, last with {description}; the store is unavailable"
                ) from None
            raise StorageError(url, f"{what} failed: {description}") from None
        STATS.add(requests=1, nbytes=size_of(result) if size_of is not None else 0)
        return result


def transient_os_error(exc: BaseException) -> bool:
    """A reset or refused connection or a timeout at the socket level."""
    return isinstance(exc, (ConnectionError, TimeoutError))


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, one line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Sorted runs of a segment closer than this many bytes are read with one request (0: only touching runs).
MAX_GAP_ENV = "ENERGON_RAY_STORAGE_MAX_GAP_BYTES"


def max_gap_from_environment() -> int:
    """``ENERGON_RAY_STORAGE_MAX_GAP_BYTES`` (e.g. ``256e3``), 0 when unset.

    Raises:
        ValueError: not a number >= 0, naming the variable.
    """
    raw = os.environ.get(MAX_GAP_ENV, "").strip()
    try:
        value = int(float(raw)) if raw else 0
    except ValueError:
        raise ValueError(f"{MAX_GAP_ENV}={raw!r} is not a number of bytes") from None
    if value < 0:
        raise ValueError(f"{MAX_GAP_ENV}={raw!r} must be >= 0")
    return value


def env_snapshot(prefixes: Tuple[str, ...]) -> Tuple[Tuple[str, str], ...]:
    """The environment variables starting with one of ``prefixes`` (a cache key for resolved settings)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))
