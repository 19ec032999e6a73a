"""``msc://profile/path``: multi-storage-client profiles, resolved through its own config.

The config is found the way multi-storage-client (and so Energon) finds it: ``MSC_CONFIG``, then its
default paths. The process that opens a dataset reads it once and its content travels with the read
tasks (never printed), so Ray workers need no config file of their own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

from energon_ray.storage.cache import CacheConfig
from energon_ray.storage.errors import StorageError, TruncatedObjectError, register_secret
from energon_ray.storage.retry import (
    DENIED, FATAL, MISSING, NO_BUCKET, TRANSIENT, RetryPolicy, call, describe, env_snapshot, max_gap_from_environment,
    transient_os_error,
)  # fmt: skip
from energon_ray.storage.s3 import range_not_satisfiable, size_of_refused

_SECRET_WORDS = ("key", "secret", "token", "password", "credential")
#: entries of a credential block that are no credential
_PLAIN_NAMES = frozenset({"type", "region", "region_name", "endpoint", "endpoint_url", "base_path", "bucket", "profile"})


@dataclasses.dataclass(frozen=True)
class MscSettings:
    """One multi-storage-client profile and the config that defines it (not in the repr)."""

    profile: str
    #: The MSC config as JSON (it may hold keys, so it is never shown).
    config_json: str = dataclasses.field(default="{}", repr=False)
    #: Where the config came from (for messages).
    config_file: Optional[str] = None
    retry: RetryPolicy = RetryPolicy()
    cache: Optional[CacheConfig] = None
    #: Sorted sample runs of a segment this close (bytes) are read with one request.
    max_gap_bytes: int = 0

    def __setstate__(self, state: Dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        _register_secrets(json.loads(self.config_json))

    @classmethod
    def from_environment(cls, profile: str) -> "MscSettings":
        """Read the MSC config (``MSC_CONFIG`` or msc's default paths) for ``profile`` (cached per environment).

        Raises:
            StorageError: no config defines ``profile``.
        """
        key = (profile, env_snapshot(("MSC_", "AWS_", "ENERGON_RAY_")))
        with _LOCK:
            found = _SETTINGS.get(key)
        if found is not None:
            return found
        from multistorageclient.config import StorageClientConfig

        config, file = StorageClientConfig.read_msc_config()
        config = _with_variables(config)
        profiles = (config or {}).get("profiles") or {}
        if profile not in profiles:
            raise StorageError(f"msc://{profile}", f"profile {profile!r} is not defined{_where_config(file)}")
        _register_secrets(config)
        settings = cls(
            profile=profile, config_json=json.dumps(config, sort_keys=True, default=str), config_file=file,
            retry=RetryPolicy.from_environment(), cache=CacheConfig.from_environment(),
            max_gap_bytes=max_gap_from_environment(),
        )  # fmt: skip
        with _LOCK:
            _SETTINGS[key] = settings
        return settings


def _with_variables(config: Any) -> Any:
    """``config`` with its ``${VAR}`` references replaced by this process's values, as
    multi-storage-client does when it builds a client: the config travels to Ray workers, whose
    environment may lack them (keys, endpoints), and the keys so named are registered as secrets. A
    reference to a variable not set here is left for multi-storage-client to report."""
    from multistorageclient.utils import expand_env_vars

    try:
        return expand_env_vars(config)
    except ValueError:
        return config


def _where_config(file: Optional[str]) -> str:
    """Where the MSC config was looked for, for a message: multi-storage-client passes over an
    ``MSC_CONFIG`` that does not exist without a word, so a typo in it is said here."""
    named = os.environ.get("MSC_CONFIG")
    missing = f"MSC_CONFIG={named} does not exist" if named and not os.path.exists(named) else None
    if file is None:
        return f": {missing} (no MSC config file found elsewhere)" if missing else " in the MSC config (no MSC config file found (set MSC_CONFIG))"
    return f" in the MSC config ({file}; {missing})" if missing else f" in the MSC config ({file})"


_LOCK = threading.Lock()
_SETTINGS: Dict[Tuple, MscSettings] = {}
_CLIENTS: Dict[Tuple[str, str], Any] = {}


def _register_secrets(node: Any, secret: bool = False) -> None:
    """Register the strings of an MSC config's credential entries (under a key naming a key, secret,
    token, password or credential), but not what says which provider it is or where it is (``type``,
    an endpoint, a region…: redacting those blanked, say, every ``S3Credentials`` in any message)."""
    if isinstance(node, dict):
        for name, value in node.items():
            lowered = str(name).lower()
            if lowered not in _PLAIN_NAMES:
                _register_secrets(value, secret or any(w in lowered for w in _SECRET_WORDS))
    elif isinstance(node, list):
        for value in node:
            _register_secrets(value, secret)
    elif secret and isinstance(node, str):
        register_secret(node)


def client_for(settings: MscSettings) -> Any:
    """This process's ``StorageClient`` for the profile (made once per config)."""
    key = (settings.profile, settings.config_json)
    with _LOCK:
        client = _CLIENTS.get(key)
    if client is not None:
        return client
    from multistorageclient import StorageClient, StorageClientConfig

    config_dict = _without_own_retries(json.loads(settings.config_json), settings.profile)
    config = StorageClientConfig.from_dict(config_dict, profile=settings.profile)
    client = StorageClient(config)
    with _LOCK:
        return _CLIENTS.setdefault(key, client)


#: retries of multi-storage-client's ``rust_client`` (object_store's ``max_retries``): none, ours count
RUST_CLIENT_RETRIES = 0
#: multi-storage-client providers that are botocore S3 clients (their ``retries`` option is botocore's).
_BOTOCORE_PROVIDERS = ("s3", "s8k", "ais_s3", "gcs_s3", "s3_cuobject")


def _without_own_retries(config: Dict[str, Any], profile: str) -> Dict[str, Any]:
    """``config`` with ``profile`` making one attempt per request, in multi-storage-client's loop, in
    botocore's and in its ``rust_client``'s (when the profile reads through it): :func:`~energon_ray.storage.retry.call` retries (and counts) them, as for ``s3://``;
    both loops at once had made up to 3 x 3 hidden attempts, sleeping a second or more, per one of ours."""
    node = (config.get("profiles") or {}).get(profile)
    if not isinstance(node, dict):
        return config
    node = {**node, "retry": {**(node.get("retry") or {}), "attempts": 1}}
    provider = node.get("storage_provider")
    if isinstance(provider, dict):
        options = dict(provider.get("options") or {})
        if provider.get("type") in _BOTOCORE_PROVIDERS:
            options["retries"] = {"total_max_attempts": 1}
        rust = options.get("rust_client")
        if isinstance(rust, dict):  # its requests bypass botocore, with a retry loop of their own
            options["rust_client"] = {**rust, "retry": {**(rust.get("retry") or {}), "attempts": RUST_CLIENT_RETRIES}}
        node["storage_provider"] = {**provider, "options": options}
    return {**config, "profiles": {**config["profiles"], profile: node}}


def classify(exc: BaseException) -> Tuple[str, str]:
    """The retry kind of a multi-storage-client exception."""
    from multistorageclient.types import RetryableError

    missing_bucket = _no_such_bucket(exc)
    if missing_bucket is not None:
        return NO_BUCKET, describe(missing_bucket)
    if isinstance(exc, FileNotFoundError):
        return MISSING, describe(exc).split(" request_id:")[0]
    if isinstance(exc, PermissionError):
        return DENIED, describe(exc).split(" request_id:")[0]
    if isinstance(exc, RetryableError) or transient_os_error(exc):
        return TRANSIENT, describe(exc).split(" request_id:")[0]
    if _s3_cause_is_transient(exc) or _rust_answer_is_transient(exc):
        return TRANSIENT, describe(exc).split(" request_id:")[0]
    return FATAL, describe(exc)


def _no_such_bucket(exc: BaseException) -> Optional[BaseException]:
    """The botocore "NoSuchBucket" answer that ``exc`` is or wraps (multi-storage-client raises a
    ``FileNotFoundError`` that says only that the object does not exist, or a ``RuntimeError`` when
    it lists), else None."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict) and (response.get("Error") or {}).get("Code") == "NoSuchBucket":
            return candidate
    return None


def _range_refusal(exc: BaseException) -> Optional[BaseException]:
    """The botocore answer "range not satisfiable" (HTTP 416: a range that starts past the object's end)
    that ``exc`` is or wraps (multi-storage-client raises it as a ``RuntimeError`` around it), else None."""
    for candidate in (exc, exc.__cause__):
        if candidate is not None and range_not_satisfiable(candidate):
            return candidate
    return None


def _s3_cause_is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` wraps a botocore error that is transient for ``s3://`` (multi-storage-client
    raises a refused connection or a connect timeout as a non-retryable ``RuntimeError`` around it):
    an ``msc://`` profile on S3 retries what an ``s3://`` URL retries."""
    cause = exc.__cause__
    if cause is None or not type(cause).__module__.startswith("botocore"):
        return False
    from energon_ray.storage.s3 import classify as classify_s3

    return classify_s3(cause)[0] == TRANSIENT


#: the HTTP status in a ``rust_client`` error ("Server returned non-2xx status code: 503 Service Unavailable")
_RUST_STATUS = re.compile(r"status code: (\d{3})\b")


def _rust_answer_is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` wraps a ``rust_client`` error whose store answered 429 or 5xx (SlowDown …): with
    its own retries off (``RUST_CLIENT_RETRIES``), multi-storage-client raises that as a ``RuntimeError``
    around the client's, where ``s3://`` retries such an answer."""
    cause = exc.__cause__
    if cause is None or type(cause).__module__.startswith("botocore"):
        return False
    match = _RUST_STATUS.search(str(cause))
    return match is not None and (int(match.group(1)) == 429 or int(match.group(1)) >= 500)


class MscBackend:
    """Requests on one profile, each retried by :func:`~energon_ray.storage.retry.call`."""

    scheme = "msc"

    def __init__(self, profile: str, settings: MscSettings):
        self.profile = profile
        self.settings = settings

    def _call(self, url: str, what: str, operation, size_of=None):
        return call(operation, url=url, what=what, policy=self.settings.retry, classify=classify, size_of=size_of)

    def _client(self, url: str) -> Any:
        """This process's client, or a ``StorageError`` naming ``url`` and the profile when this node
        cannot make one (a provider's settings it cannot use, a credentials provider that fails here):
        such an error had escaped a Ray read task as multi-storage-client's own, naming no URL."""
        try:
            return client_for(self.settings)
        except Exception as exc:
            raise StorageError(
                url, f"cannot make multi-storage-client's client of profile {self.profile!r} on this node: {describe(exc)}"
            ) from None

    def get(self, url: str, key: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        from multistorageclient.types import Range

        client = self._client(url)
        if start is None or end is None:
            return self._call(url, "read", lambda: client.read(key), size_of=len)
        if end <= start:
            return b""

        def operation() -> bytes:
            try:
                data = client.read(key, byte_range=Range(offset=start, size=end - start))
            except Exception as exc:
                refused = _range_refusal(exc)
                if refused is None:
                    raise
                raise TruncatedObjectError.of_range(url, start, end, size_of_refused(refused)) from None
            if len(data) != end - start:
                raise TruncatedObjectError.of_range(url, start, end, start + len(data) if data else None)
            return data

        return self._call(url, f"read of bytes [{start}, {end})", operation, size_of=len)

    def head(self, url: str, key: str) -> Optional[Tuple[int, str]]:
        client = self._client(url)

        def operation() -> Optional[Tuple[int, str]]:
            try:
                meta = client.info(key)
            except FileNotFoundError:
                return None
            if meta.type != "file":
                return None
            return int(meta.content_length), str(meta.etag or "")

        return self._call(url, "info", operation)

    def list(self, url: str, prefix: str, limit: Optional[int] = None) -> Iterator[Tuple[str, int]]:
        client = self._client(url)
        items = self._call(url, "list", lambda: list(client.list(path=prefix)))
        count = 0
        for meta in sorted(items, key=lambda m: m.key):
            if meta.type != "file" or not meta.key.startswith(prefix):
                continue
            yield meta.key, int(meta.content_length)
            count += 1
            if limit is not None and count >= limit:
                return

    def put(self, url: str, key: str, data: bytes) -> None:
        client = self._client(url)
        self._call(url, "write", lambda: client.write(key, data))

    def delete(self, url: str, key: str) -> None:
        client = self._client(url)
        self._call(url, "delete", lambda: client.delete(key))
