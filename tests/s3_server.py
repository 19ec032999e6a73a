"""A real S3-compatible server for tests: moto's server app on a free local port, behind a small WSGI
layer that logs requests and injects faults (503 SlowDown answers, connections dropped mid-body)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Tuple

ACCESS_KEY = "AKIAENERGONRAYTEST01"
SECRET_KEY = "energon-ray-test-secret-key-do-not-print"
REGION = "us-east-1"


_ERRORS = {"503": ("503 Service Unavailable", "SlowDown"), "403": ("403 Forbidden", "AccessDenied")}


@dataclasses.dataclass
class Request:
    """One request the server saw."""

    method: str
    path: str
    range: Optional[str]
    fault: Optional[str] = None


class FaultyApp:
    """WSGI middleware: records every request and answers the next matching ones with a fault.

    ``fail(kind, count, ranged_only)``: the next ``count`` requests (only ranged GETs when
    ``ranged_only``) get ``kind``: ``"503"`` (an S3 SlowDown answer), ``"403"`` (AccessDenied) or
    ``"drop"`` (headers and half the body, then the connection is cut).
    """

    def __init__(self, app: Callable):
        self.app = app
        self.lock = threading.Lock()
        self.requests: List[Request] = []
        self._faults: List[Tuple[str, bool]] = []

    def fail(self, kind: str, count: int, ranged_only: bool = True) -> None:
        with self.lock:
            self._faults.extend([(kind, ranged_only)] * count)

    def pending_faults(self) -> int:
        with self.lock:
            return len(self._faults)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self._faults.clear()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        request = Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE"))
        with self.lock:
            if self._faults and (request.range is not None or not self._faults[0][1]):
                request.fault = self._faults.pop(0)[0]
            self.requests.append(request)
        if request.fault in _ERRORS:
            status, code = _ERRORS[request.fault]
            body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>Injected by the test.</Message></Error>".encode()
            start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body]
        if request.fault == "drop":
            return self._dropped(environ, start_response)
        return self.app(environ, start_response)

    def _dropped(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        body = b"".join(self.app(environ, start_response))

        def cut() -> Iterable[bytes]:
            yield body[: len(body) // 2]
            raise ConnectionResetError("test server drops the connection mid-body")

        return cut()


class S3Server:
    """moto's S3 in server mode on ``127.0.0.1:<free port>``; ``stop()`` shuts it down."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, *args: Any, **kwargs: Any) -> None:
                pass

        self.app = FaultyApp(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=Quiet)
        self.port = self._server.socket.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def env(self) -> dict:
        """The standard AWS variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )  # fmt: skip

    def upload(self, folder: Path, bucket: str, prefix: str) -> str:
        """Copy every file under ``folder`` to ``s3://bucket/prefix/``; returns that URL."""
        client = self.client()
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())
        return f"s3://{bucket}/{prefix}"

    def download(self, bucket: str, prefix: str) -> dict:
        """``{relative key: bytes}`` of every object under ``prefix/``."""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                key = item["Key"]
                out[key[len(prefix) + 1 :]] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return out

    def ranged_gets(self, fragment: str = "") -> List[Request]:
        """The ranged GETs seen so far whose path contains ``fragment``."""
        with self.app.lock:
            return [r for r in self.app.requests if r.method == "GET" and r.range and fragment in r.path]

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)
