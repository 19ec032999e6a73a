"""Storage errors: each names the URL it is about, never a credential.

They are ``OSError`` subclasses (a missing object is also a ``FileNotFoundError``, a refused one a
``PermissionError``), so code written for local files handles them as it handles local ones.
"""

from __future__ import annotations

import threading
from typing import Set

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


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the request: missing, wrong or expired credentials, or no permission."""


class StorageUnavailableError(StorageError):
    """A transient error (5xx, throttling, a dropped connection, a timeout) outlasted every retry."""


class TruncatedObjectError(StorageError):
    """The object is shorter than the byte range asked for (the file changed, or its index is stale)."""
