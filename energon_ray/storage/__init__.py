"""Where dataset files live: local paths, ``s3://`` and ``msc://`` object stores.

One small layer: :func:`as_path` gives a ``pathlib.Path`` for a local path and a :class:`RemotePath`
(the same methods: ``/``, ``name``, ``parent``, ``is_file``, ``read_bytes``, ``write_bytes``, ``glob``…
plus ``read_range``) for a URL. Remote requests are retried on transient errors and counted in
:data:`STATS`; failures raise :class:`StorageError` subclasses naming the URL, never a credential.
"""

from energon_ray.storage.cache import CacheConfig, ShardCache
from energon_ray.storage.errors import (
    AccessDeniedError, BucketNotFoundError, ObjectNotFoundError, StorageError, StorageUnavailableError, TruncatedObjectError, redact,
)  # fmt: skip
from energon_ray.storage.path import RemoteFile, RemotePath, as_path, is_remote, local_of, read_optional, settings_of
from energon_ray.storage.retry import STATS, RetryPolicy

__all__ = [
    "STATS", "AccessDeniedError", "BucketNotFoundError", "CacheConfig", "ObjectNotFoundError", "RemoteFile", "RemotePath", "RetryPolicy",
    "ShardCache", "StorageError", "StorageUnavailableError", "TruncatedObjectError", "as_path", "is_remote", "local_of",
    "read_optional", "redact", "settings_of",
]  # fmt: skip
