"""Storage errors: each names the URL it is about, never a credential.

They are ``OSError`` subclasses (a missing object is also a ``FileNotFoundError``, a refused one a
``PermissionError``), so code written for local files handles them as it handles local ones.
"""

from __future__ import annotations

import threading
from typing import Optional, Set

_SECRETS: Set[str] = set()
_LOCK = threading.Lock()


def register_secret(value: str) -> None:
    """Remember a credential of this process so :func:`redact` blanks it out of any message (values
    shorter than 8 characters are no real keys and would blank out ordinary words)."""
    if value and len(value) >= 8:
        with _LOCK:
            _SECRETS.add(value)


def redact(text: str) -> str:
    """``text`` with every registered credential replaced by ``***``.

    Example:
        >>> register_secret("hunter2-secret")
        >>> redact("signature for hunter2-secret did not match")
        'signature for *** did not match'
    """
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


class StorageError(OSError):
    """An object store request failed for good; the message names the URL.

    Args:
        url: the object or prefix (``s3://bucket/key``, ``msc://profile/path``).
        message: what happened (credentials are blanked out).
    """

    def __init__(self, url: str, message: str):
        self.url = url
        self.reason = redact(message)
        super().__init__(f"{url}: {self.reason}")

    def __str__(self) -> str:
        return f"{self.url}: {self.reason}"

    def __reduce__(self):
        return (type(self), (self.url, self.reason))


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist."""


class BucketNotFoundError(ObjectNotFoundError):
    """The bucket does not exist (a wrong URL or ``msc://`` profile, not a file that is missing):
    reads that take a missing file for "none" (``read_optional``, the file stores) raise it."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the request: missing, wrong or expired credentials, or no permission."""


class StorageUnavailableError(StorageError):
    """A transient error (5xx, throttling, a dropped connection, a timeout) outlasted every retry."""


class TruncatedObjectError(StorageError):
    """The object is shorter than the byte range asked for (the file changed, or its index is stale).

    Args:
        size: the object's size in bytes, where the store said it (None otherwise).
    """

    def __init__(self, url: str, message: str, size: Optional[int] = None):
        super().__init__(url, message)
        self.size = size

    def __reduce__(self):
        return (type(self), (self.url, self.reason, self.size))

    @classmethod
    def of_range(cls, url: str, start: int, end: int, size: Optional[int]) -> "TruncatedObjectError":
        """The error for a read of bytes ``[start, end)`` of an object of ``size`` bytes (None: not known)."""
        has = f"the object has {size} bytes" if size is not None else "the object is shorter"
        return cls(url, f"wanted bytes [{start}, {end}) but {has}", size)
