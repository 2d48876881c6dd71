"""The HTTP front: stdlib ThreadingHTTPServer, one thread per connection, HTTP/1.1 keep-alive.

Why the standard library: measured per-request server CPU on this 2-core box (runtime/README.md)
is on par with aiohttp and well below uvicorn+starlette, it needs no dependency on Python 3.8
nodes, and the model runs in the batcher's thread anyway, so connection threads only parse and
wait. TCP_NODELAY is essential: without it headers and body leave in two segments and Nagle +
delayed ACK add 40 ms to every response.

Routes: POST /v1/predict, GET /v1/model, /livez, /readyz, /metrics. Every error is JSON
{"error": {"type", "message"}}; client mistakes are 4xx and the connection stays usable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from . import codec
from .batcher import OutOfMemory, QueueFull, Stopped
from .codec import RequestError

if TYPE_CHECKING:
    from .service import Runtime

log = logging.getLogger(__name__)

ROUTES = {
    "/v1/predict": ("POST",),
    "/v1/model": ("GET", "HEAD"),
    "/livez": ("GET", "HEAD"),
    "/readyz": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
}


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024  # the default listen backlog of 5 resets connections under load
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], runtime: Runtime) -> None:
        self.runtime = runtime
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a full traceback to stderr; a client that resets an idle
        # keep-alive connection (load balancers, benchmark clients) is routine, not an error.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("connection from %s dropped: %r", client_address, exc)
        else:
            log.error("error while serving %s", client_address, exc_info=exc)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "torchfleet-runtime"
    server: HTTPServer

    # --- plumbing -----------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        record = getattr(self, "_record", None)
        if record is not None:  # metrics first: a client that saw its answer finds it counted
            self._record = None
            record(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc).encode(), headers=headers)

    def _error(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> None:
        self._json(status, {"error": {"type": type_, "message": message}}, headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors found by the stdlib parser (bad request line, huge headers): JSON too."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._error(code, "bad_request", message or self.responses.get(code, ("error",))[0])

    def _dispatch(self) -> None:
        path = self.path.split("?", 1)[0]
        methods = ROUTES.get(path)
        if methods is None:
            self._discard_body()
            self._error(404, "not_found", f"no route {path!r}; routes: {', '.join(ROUTES)}")
            return
        if self.command not in methods:
            self._discard_body()
            self._error(405, "method_not_allowed", f"{self.command} is not allowed on {path}; use {' or '.join(methods)}",
                        {"Allow": ", ".join(methods)})
            return
        getattr(self, "_" + path.strip("/").replace("/", "_"))()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    def _content_length(self) -> int | None:
        raw = self.headers.get("Content-Length")
        if raw is None:
            return None
        try:
            n = int(raw)
        except ValueError:
            n = -1
        if n < 0:
            raise RequestError(400, "bad_request", f"Content-Length {raw!r} is not a non-negative integer")
        return n

    def _discard_body(self) -> None:
        """Read and drop a body we will not use, so the next request on this connection parses."""
        try:
            n = self._content_length()
        except RequestError:
            self.close_connection = True
            return
        if n:
            if n > 1 << 20:
                self.close_connection = True
            else:
                self.rfile.read(n)

    # --- routes ---------------------------------------------------------------------------

    def _livez(self) -> None:
        ok, why = self.server.runtime.liveness()
        if ok:
            self._json(200, {"status": "alive"})
        else:
            self._error(503, "not_alive", why)

    def _readyz(self) -> None:
        rt = self.server.runtime
        if rt.is_ready():
            self._json(200, {"status": "ready"})
        else:
            self._error(503, "not_ready", f"the runtime is {rt.state}", {"Retry-After": "1"})

    def _metrics(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        self._send(200, self.server.runtime.metrics.render(), CONTENT_TYPE_LATEST)

    def _v1_model(self) -> None:
        info = self.server.runtime.describe()
        if info is None:
            self._error(503, "not_ready", f"the runtime is {self.server.runtime.state}", {"Retry-After": "1"})
        else:
            self._json(200, info)

    def _v1_predict(self) -> None:
        rt = self.server.runtime
        started = time.perf_counter()

        def record(status: int) -> None:
            rt.metrics.requests.labels(code=str(status)).inc()
            if status == 200:
                rt.metrics.request_duration.observe(time.perf_counter() - started)
                rt.metrics.last_request.set(time.time())

        self._record = record
        with rt.track_request():
            try:
                self._predict(rt)
            except RequestError as exc:
                self._error(exc.status, exc.type, exc.message)
            except Exception as exc:  # the model failed: the client did nothing wrong
                log.exception("prediction failed")
                self._error(500, "model_error", f"{type(exc).__name__}: {exc}")

    def _predict(self, rt: Runtime) -> None:
        if not rt.is_ready():
            self._discard_body()
            self._error(503, "not_ready", f"the runtime is {rt.state}", {"Retry-After": rt.retry_after_not_ready()})
            return
        # Announce the arrival before reading the body, so a forming batch waits for it.
        rt.batcher.expect()
        try:
            tensor, batched = self._read_tensor(rt)
        except BaseException:
            rt.batcher.unexpect()
            raise
        try:
            request = rt.batcher.submit(tensor, expected=True)
        except QueueFull as exc:
            self._error(503, "queue_full", str(exc), {"Retry-After": str(exc.retry_after_s)})
            return
        except Stopped:
            self._error(503, "not_ready", "the runtime is draining", {"Retry-After": "5"})
            return
        try:
            outputs = request.result()
        except OutOfMemory as exc:
            self._error(503, "out_of_memory", str(exc), {"Retry-After": "5"})
            return
        accept = self.headers.get("Accept", "")
        if "application/octet-stream" in accept and "application/json" not in accept:
            data, headers = codec.encode_raw(outputs, batched)
            self._send(200, data, "application/octet-stream", headers)
        else:
            self._send(200, codec.encode_json(outputs, batched))

    def _read_tensor(self, rt: Runtime) -> tuple[Any, bool]:
        n = self._content_length()
        if n is None:
            self.close_connection = True
            raise RequestError(400, "bad_request", "Content-Length is required (chunked bodies are not accepted)")
        if n > rt.max_body_bytes:
            self.close_connection = True  # do not read a body this large just to discard it
            raise RequestError(413, "payload_too_large",
                               f"the body has {n} bytes; the limit is {rt.max_body_bytes} (config key max_body_mb)")
        body = bytearray(n)
        view = memoryview(body)
        got = 0
        while got < n:
            k = self.rfile.readinto(view[got:])
            if not k:
                self.close_connection = True
                raise RequestError(400, "bad_request", f"the body ended after {got} of {n} bytes")
            got += k
        meta = rt.loaded.metadata
        tensor, batched = codec.decode(body, self.headers.get("Content-Type", ""), self.headers,
                                       meta.input_shape, meta.torch_dtype)
        return tensor, batched
