"""An S3 HTTP API on the loopback, for the tests of object stores: moto's server (``moto[server]``), run in a
thread of this process, behind a WSGI layer that records every request and the bytes of every response body
it sent (``Request``), and that can hold or fail chosen requests (``hold``, ``fail``). Clients reach it as
they reach AWS: through ``AWS_ENDPOINT_URL`` (``env()``), with made-up credentials; nothing is mocked in the
client, and nothing leaves the machine.

    server = s3server.start()          # one per process, started on first use
    server.bucket("name")              # a new bucket
    with server.measure() as seen: ... # seen.bytes("bucket/key"): what the server sent for that object
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key-not-for-printing"


@dataclass
class Request:
    method: str
    path: str  # /bucket/key, unquoted
    query: str
    range: str | None
    sent: int = 0  # bytes of the response body


@dataclass
class Seen:
    requests: list[Request] = field(default_factory=list)

    def bytes(self, key: str, method: str = "GET") -> int:
        """The body bytes the server sent for ``bucket/key`` (GET requests by default)."""
        return sum(r.sent for r in self.requests if r.path.lstrip("/") == key and r.method == method)

    def of(self, key: str) -> list[Request]:
        return [r for r in self.requests if r.path.lstrip("/") == key]


class S3Server:
    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, *args: Any, **kwargs: Any) -> None:  # no line per request on the test's stderr
                pass

        self.app = DomainDispatcherApplication(create_backend_app)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        #: a hook on each request (method, path, query) -> None, "fail" (a 500 error) or "hold" (the request waits
        #: until ``release`` is set; ``holding`` is set meanwhile)
        self.hook: Callable[[str, str, str], str | None] | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=Quiet)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._buckets = 0

    def _wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        request = Request(environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO", "")),
                          environ.get("QUERY_STRING", ""), environ.get("HTTP_RANGE"))
        with self._lock:
            self.requests.append(request)
        hook = self.hook
        action = hook(request.method, request.path, request.query) if hook is not None else None
        if action == "hold":
            self.holding.set()
            self.release.wait(60)
        if action == "fail":
            body = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
                    b"<Message>injected by the test</Message></Error>")
            start_response("500 Internal Server Error", [("Content-Type", "application/xml"),
                                                         ("Content-Length", str(len(body)))])
            request.sent = len(body)
            return [body]
        body = self.app(environ, start_response)

        def counted() -> Iterator[bytes]:
            try:
                for chunk in body:
                    request.sent += len(chunk)
                    yield chunk
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

        return counted()

    def env(self) -> dict[str, str]:
        """The environment of a client of this server (no profile, no proxy)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def bucket(self, stem: str = "bkt") -> str:
        """A new, empty bucket."""
        with self._lock:
            self._buckets += 1
            name = f"{stem}-{os.getpid()}-{self._buckets}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        found = self.client().list_objects_v2(Bucket=bucket).get("Contents", [])
        return sorted(o["Key"] for o in found)

    def uploads(self, bucket: str) -> list[str]:
        """Multipart uploads begun and neither completed nor aborted."""
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    @contextmanager
    def measure(self) -> Iterator[Seen]:
        """The requests made within the block."""
        with self._lock:
            start = len(self.requests)
        seen = Seen()
        try:
            yield seen
        finally:
            with self._lock:
                seen.requests = list(self.requests[start:])


_server: S3Server | None = None
_started = threading.Lock()


def start() -> S3Server:
    """The server of this process (started on first use); the test is skipped where moto is not installed."""
    global _server
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    with _started:
        if _server is None:
            for name in ("NO_PROXY", "no_proxy"):  # a proxy of the environment is not for the loopback
                kept = [h for h in os.environ.get(name, "").split(",") if h]
                os.environ[name] = ",".join([*kept, "127.0.0.1", "localhost"])
            _server = S3Server()
    return _server
