"""``s3://bucket/key``: S3 and S3-compatible stores (MinIO, Ceph, SwiftStack…) through botocore.

Settings come from the standard AWS environment and config files (``AWS_ENDPOINT_URL[_S3]``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_REGION``/
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, ``~/.aws/config``'s ``endpoint_url`` and
``s3.addressing_style``, ``AWS_MAX_ATTEMPTS``), resolved once in the process that opens a dataset.
They travel with the read tasks, so Ray workers on any node use the same endpoint and region; static
keys travel too (never printed: see :class:`S3Settings`), while credentials that refresh themselves
(instance roles, SSO, assumed roles) are resolved again by each worker through its own AWS chain.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

from energon_ray.storage.cache import CacheConfig
from energon_ray.storage.errors import AccessDeniedError, StorageError, TruncatedObjectError, register_secret
from energon_ray.storage.retry import (
    DENIED, FATAL, MISSING, NO_BUCKET, TRANSIENT, RetryPolicy, call, describe, env_snapshot, max_gap_from_environment,
    transient_os_error,
)  # fmt: skip

#: Credential sources whose keys are static, so they may be handed to workers.
_STATIC_METHODS = ("env", "shared-credentials-file", "config-file", "explicit")
_MISSING_CODES = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
_DENIED_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken", "AllAccessDisabled", "AccountProblem"}  # fmt: skip
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeoutException",
                    "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequestsException",
                    "BandwidthLimitExceeded", "EC2ThrottledException", "PriorRequestNotComplete"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """Where and how to reach S3, as resolved from the AWS environment of the process that made it.

    The repr never shows the keys (``credentials='static'`` or ``'each node'``).
    """

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    addressing_style: Optional[str] = None
    #: The AWS profile each worker uses when no static keys travel.
    profile: Optional[str] = None
    access_key: Optional[str] = dataclasses.field(default=None, repr=False)
    secret_key: Optional[str] = dataclasses.field(default=None, repr=False)
    session_token: Optional[str] = dataclasses.field(default=None, repr=False)
    retry: RetryPolicy = RetryPolicy()
    cache: Optional[CacheConfig] = None
    #: Sorted sample runs of a segment this close (bytes) are read with one request.
    max_gap_bytes: int = 0

    def __repr__(self) -> str:
        creds = "static" if self.secret_key else "each node"
        return (
            f"S3Settings(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
            f"addressing_style={self.addressing_style!r}, profile={self.profile!r}, credentials={creds!r})"
        )

    def __setstate__(self, state: Dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self._register()

    def _register(self) -> None:
        for value in (self.access_key, self.secret_key, self.session_token):
            if value:
                register_secret(value)

    @classmethod
    def from_environment(cls) -> "S3Settings":
        """Resolve endpoint, region, addressing style and credentials as boto3 would (cached per environment)."""
        key = env_snapshot(("AWS_", "ENERGON_RAY_"))
        with _LOCK:
            found = _SETTINGS.get(key)
        if found is not None:
            return found
        settings = _resolve()
        with _LOCK:
            _SETTINGS[key] = settings
        return settings


_LOCK = threading.Lock()
_SETTINGS: Dict[Tuple, S3Settings] = {}
_CLIENTS: Dict[S3Settings, Any] = {}


def _resolve() -> S3Settings:
    import botocore.session

    session = botocore.session.Session()
    client = session.create_client("s3")
    endpoint = client.meta.endpoint_url
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    custom = not (host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn"))
    style = (client.meta.config.s3 or {}).get("addressing_style")
    creds = session.get_credentials()
    static = creds is not None and creds.method in _STATIC_METHODS
    frozen = creds.get_frozen_credentials() if static else None
    settings = S3Settings(
        endpoint_url=endpoint if custom else None,
        region=client.meta.region_name,
        addressing_style=style if style and style != "auto" else None,
        profile=None if static else session.profile,
        access_key=frozen.access_key if frozen else None,
        secret_key=frozen.secret_key if frozen else None,
        session_token=frozen.token if frozen else None,
        retry=RetryPolicy.from_environment(),
        cache=CacheConfig.from_environment(),
        max_gap_bytes=max_gap_from_environment(),
    )
    settings._register()
    return settings


def client_for(settings: S3Settings) -> Any:
    """This process's botocore client for ``settings`` (made once; botocore clients are thread-safe).

    The client does not retry by itself: :func:`~energon_ray.storage.retry.call` does, and counts it.
    """
    with _LOCK:
        client = _CLIENTS.get(settings)
    if client is not None:
        return client
    import botocore.config
    import botocore.session

    session = botocore.session.Session(profile=settings.profile) if settings.profile else botocore.session.Session()
    config = botocore.config.Config(
        retries={"total_max_attempts": 1},
        max_pool_connections=32,
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": settings.addressing_style} if settings.addressing_style else None,
    )
    client = session.create_client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=config,
        aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.session_token,
    )  # fmt: skip
    with _LOCK:
        return _CLIENTS.setdefault(settings, client)


def classify(exc: BaseException) -> Tuple[str, str]:
    """The retry kind of a botocore (or socket) exception and a short description without secrets."""
    from botocore import exceptions as bce

    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {}) or {}
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = str(error.get("Code") or status or "")
        # a HEAD answer has no body: botocore's code is then the status again ("HTTP 403 403")
        shown = (error.get("Message") or "") if code == str(status) else code
        text = f"HTTP {status} {shown}".strip()
        if code == "InvalidRange" or status == 416:
            return FATAL, f"{text}: the object is shorter than the byte range asked for"
        if code == "NoSuchBucket":
            return NO_BUCKET, text
        if code in _MISSING_CODES or status == 404:
            return MISSING, text
        if code in _DENIED_CODES or status in (401, 403):
            return DENIED, text
        if code in _TRANSIENT_CODES or status == 429 or (isinstance(status, int) and status >= 500):
            return TRANSIENT, text
        return FATAL, f"{text}: {error.get('Message', '')}".rstrip(": ")
    if isinstance(exc, bce.NoCredentialsError):
        return DENIED, "no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or use an instance role)"
    # A refused connection or a connect timeout (the store restarting, overloaded) is transient, as
    # in botocore's own retry modes; our client leaves retries to us, so we must say so here.
    connect_failed = (bce.EndpointConnectionError, bce.ConnectTimeoutError)
    if isinstance(exc, (bce.HTTPClientError, bce.IncompleteReadError, bce.ResponseStreamingError, *connect_failed)):
        return TRANSIENT, describe(exc)
    if transient_os_error(exc) or type(exc).__name__ in ("ProtocolError", "IncompleteRead", "ReadTimeoutError"):
        return TRANSIENT, describe(exc)
    return FATAL, describe(exc)


class S3Backend:
    """Requests on one bucket, each retried by :func:`~energon_ray.storage.retry.call`."""

    scheme = "s3"

    def __init__(self, bucket: str, settings: S3Settings):
        self.bucket = bucket
        self.settings = settings

    def _call(self, url: str, what: str, operation, size_of=None):
        return call(operation, url=url, what=what, policy=self.settings.retry, classify=classify, size_of=size_of)

    def _client(self, url: str) -> Any:
        """This process's client, or an error naming ``url`` when this node cannot make one (an AWS profile
        resolved where the dataset was opened that this node's config lacks had escaped the read as
        botocore's ``ProfileNotFound``, naming no URL)."""
        from botocore import exceptions as bce

        try:
            return client_for(self.settings)
        except (bce.ProfileNotFound, bce.NoCredentialsError, bce.PartialCredentialsError) as exc:
            raise AccessDeniedError(url, f"no credentials on this node: {describe(exc)}") from None
        except bce.BotoCoreError as exc:
            raise StorageError(url, f"cannot make an S3 client on this node: {describe(exc)}") from None

    def get(self, url: str, key: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        """The object's bytes ``[start, end)`` (all of it without a range), body read inside the retry."""
        client = self._client(url)
        ranged = start is not None and end is not None
        args: Dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if ranged:
            if end <= start:
                return b""
            args["Range"] = f"bytes={start}-{end - 1}"

        def operation() -> bytes:
            try:
                response = client.get_object(**args)
            except Exception as exc:
                if ranged and range_not_satisfiable(exc):
                    raise TruncatedObjectError.of_range(url, start, end, size_of_refused(exc)) from None
                raise
            body = response["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            if ranged and len(data) != end - start:
                total = _total_size(response.get("ContentRange"))
                if total is not None and total < end:
                    raise TruncatedObjectError.of_range(url, start, end, total)
                raise ConnectionError(f"short read: {len(data)} of {end - start} bytes")
            return data

        what = f"read of bytes [{start}, {end})" if ranged else "read"
        return self._call(url, what, operation, size_of=len)

    def head(self, url: str, key: str) -> Optional[Tuple[int, str]]:
        """``(size, etag)`` of the object, or None when it does not exist."""
        client = self._client(url)

        def operation() -> Optional[Tuple[int, str]]:
            try:
                response = client.head_object(Bucket=self.bucket, Key=key)
            except Exception as exc:
                if classify(exc)[0] == MISSING:
                    return None
                raise
            return int(response["ContentLength"]), str(response.get("ETag", ""))

        return self._call(url, "HEAD", operation)

    def list(self, url: str, prefix: str, limit: Optional[int] = None) -> Iterator[Tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``, in key order."""
        client = self._client(url)
        token: Optional[str] = None
        count = 0
        while True:
            args: Dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if limit is not None:
                args["MaxKeys"] = max(1, min(1000, limit - count))
            if token:
                args["ContinuationToken"] = token
            page = self._call(url, "list", lambda: client.list_objects_v2(**args))
            for item in page.get("Contents", []) or []:
                yield item["Key"], int(item["Size"])
                count += 1
                if limit is not None and count >= limit:
                    return
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def put(self, url: str, key: str, data: bytes) -> None:
        client = self._client(url)
        self._call(url, "write", lambda: client.put_object(Bucket=self.bucket, Key=key, Body=data))

    def delete(self, url: str, key: str) -> None:
        client = self._client(url)
        self._call(url, "delete", lambda: client.delete_object(Bucket=self.bucket, Key=key))


def range_not_satisfiable(exc: BaseException) -> bool:
    """Whether ``exc`` is S3's answer to a range that starts past the object's end (HTTP 416)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return status == 416 or (response.get("Error") or {}).get("Code") == "InvalidRange"


def size_of_refused(exc: BaseException) -> Optional[int]:
    """The object's size from a 416 answer (S3's ``ActualObjectSize``, else ``Content-Range: bytes */N``)."""
    response = getattr(exc, "response", None) or {}
    size = str((response.get("Error") or {}).get("ActualObjectSize") or "")
    if size.isdigit():
        return int(size)
    headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    return _total_size(headers.get("content-range"))


def _total_size(content_range: Optional[str]) -> Optional[int]:
    """``bytes 0-9/42`` → 42."""
    if not content_range or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1]
    return int(total) if total.isdigit() else None
