"""HTTP/1.1 on asyncio with llhttp (the `httptools` binding) as the parser: the connection layer.

Why this and not a framework: measured side by side (benchmarks/torchfleet_bench/http_stack.py and
benchmarks/README.md) it costs the least server CPU per request of the candidates, and every
property below had to be added around aiohttp and uvicorn anyway (neither has a header read
timeout, a JSON answer to a framing error, or a connection cap that answers). The parser, where
request smuggling lives, is llhttp in its strict mode, as in Node.js.

Properties (tests/runtime/test_http_edge.py and the fuzz suite hold them):
- framing per RFC 9112 section 6: conflicting or duplicate Content-Length, Transfer-Encoding with
  Content-Length, a non-digit length, bare LF line ends, whitespace before a colon: 400 and
  close. Transfer-Encoding is not accepted at all (411 and close): bodies carry Content-Length.
- limits: request line + headers at most `MAX_HEAD_BYTES` and `MAX_HEADERS` (431); headers must
  complete within `header_timeout_s` of the request's first byte and a body may not pause for
  more than `body_timeout_s` (408 and close); idle keep-alive connections close after
  `keepalive_timeout_s`; at most `max_connections` are open (beyond: 503 and close at once).
  A stalled client costs a timer and the bytes it sent, never a thread.
- a body is kept as it arrives; nothing is allocated for bytes that have not arrived.
- an early answer (404, 405, 401, 413, 415, 503 decided from the headers) is sent before the
  body is read; a small body is then skipped and the connection kept, a large one (or 413) gets
  `Connection: close` and a lingering close: the server keeps reading and dropping for up to
  `LINGER_S` so the client can finish sending and read its answer instead of a reset.
- `Expect: 100-continue` gets its interim answer only when the request is acceptable.
- answers go out in request order (pipelining); every error is JSON with a status line, in the
  flat form `{"error": "<message>"}` when the request's target (as far as it was read) is one
  the server's `flat_errors` names (server.py: the /v2 routes), else errors.error_body's.
- at stop an idle keep-alive connection is closed only after `CLOSE_GRACE_S` without a request:
  one already on its way is answered (the app refuses it: 503, Connection: close), not reset.
The application (`App`) sees whole requests and returns a `Response` or a future of one.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import ssl
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Callable, Protocol

import httptools
import orjson

from .errors import ApiError, error_body, internal_error

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 100
MAX_PIPELINE = 16  # complete requests queued behind one in progress before reading pauses
EARLY_SKIP_BYTES = (
    64 * 1024
)  # after an early answer, bodies up to this are read and dropped (keep-alive)
LINGER_S = 5.0  # a lingering close reads and drops for at most this long...
LINGER_IDLE_S = 2.0  # ...and stops after this long without data
# At stop, an idle keep-alive connection stays open this long so that a request already on its
# way is answered (503, Connection: close) instead of meeting a reset.
CLOSE_GRACE_S = 0.5
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class Request:
    __slots__ = (
        "method",
        "path",
        "query",
        "version",
        "headers",
        "body",
        "keep_alive",
        "content_length",
        "context",
        "_url",
        "_size",
        "_head",
    )

    def __init__(self) -> None:
        self.method = ""
        self.path = ""
        self.query = ""
        self.version = "1.1"
        self.headers: dict[str, str] = {}  # lower-case names; repeated fields joined with ", "
        self.body = bytearray()
        self.keep_alive = True
        self.content_length = 0
        self.context: Any = None  # the application's per-request state (set in on_headers)
        self._url = b""
        self._size = 0  # bytes of the target and the complete headers so far
        self._head = 0  # bytes fed in later chunks while the head is unfinished; -1 once it is done


class Response:
    __slots__ = ("status", "body", "content_type", "headers", "close", "on_sent")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        close: bool = False,
        on_sent: Callable[[str, float], None] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}
        self.close = close
        # on_sent("sending", 0) just before the bytes go out (so a client that read its answer
        # finds it counted), on_sent("written", seconds) after the write; on_sent("dropped", 0)
        # when the client was gone before it could be answered
        self.on_sent = on_sent


def error_response(
    exc: ApiError,
    headers: dict[str, str] | None = None,
    on_sent: Callable[[str, float], None] | None = None,
    flat: bool = False,
) -> Response:
    """The answer to `exc`; `flat`: the Open Inference Protocol's `{"error": "<message>"}`."""
    h = dict(headers or {})
    if exc.retry_after is not None:
        h["Retry-After"] = str(exc.retry_after)
    body = orjson.dumps({"error": exc.message}) if flat else error_body(exc.type, exc.message)
    return Response(exc.status, body, headers=h, close=exc.close, on_sent=on_sent)


def _internal_error(exc: Exception) -> tuple[ApiError, Response]:
    """A bug in the application (a handler raised, or its future failed): logged with the
    traceback, answered 500 with a JSON body and Connection: close, never a silent connection."""
    log.error("request handler failed", exc_info=exc)
    bug = internal_error(exc)
    return bug, error_response(bug)


class App(Protocol):
    def on_headers(self, req: Request) -> Response | None:
        """Decide from the headers alone: an early answer, or None to read the body."""

    def handle(self, req: Request) -> Response | asyncio.Future[Response]:
        """The answer to a whole request."""

    def aborted(self, req: Request, exc: ApiError | None) -> None:
        """A request `on_headers` accepted ended without `handle` (timeout, framing error, the
        client left) or `handle` raised; exc is what the client was told, None when it could not
        be told."""


class _Abort(Exception):
    """Raised inside a parser callback to stop parsing this connection (answer already queued)."""


class _Limits:
    def __init__(
        self,
        header_timeout_s: float,
        body_timeout_s: float,
        keepalive_timeout_s: float,
        max_connections: int,
        max_body_bytes: int,
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.max_connections = max_connections
        self.max_body_bytes = max_body_bytes


class _Clock:
    """The Date header, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = formatdate(now, usegmt=True).encode()
        return self._value


def _head(
    status: int, content_type: str, length: int, headers: dict[str, str], close: bool, date: bytes
) -> bytes:
    parts = [
        b"HTTP/1.1 %d %s\r\nDate: %s\r\nServer: torchfleet-runtime\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        % (status, _REASONS.get(status, "Unknown").encode(), date, content_type.encode(), length)
    ]
    for k, v in headers.items():
        parts.append(b"%s: %s\r\n" % (k.encode(), v.encode("latin-1", "replace")))
    parts.append(b"Connection: close\r\n\r\n" if close else b"\r\n")
    return b"".join(parts)


class Connection(asyncio.Protocol):
    """One client connection: parse, queue, answer in order, time out, linger."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._limits = server.limits
        self._app = server.app
        self._loop = server.loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._req: Request | None = None  # being parsed
        self._skipping = False  # the request being parsed was answered early: drop its body
        self._queue: collections.deque[list[Any]] = (
            collections.deque()
        )  # [request, response or None, started]
        self._closing = False  # answers carry Connection: close; close once they are out
        self._eof = False  # the client half-closed: close once the queued answers are out
        self._lingering = False
        self._paused = False
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._timeout_kind = ""
        self._linger_until = 0.0
        self._began = False  # a request began in the chunk being fed
        self.peer = ""

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it headers and body leave in two segments and Nagle + delayed ACK add 40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = self._server
        s.connections.add(self)
        s.on_count(len(s.connections))
        if len(s.connections) > self._limits.max_connections:
            log.warning(
                "connection from %s refused: %d open (config key max_connections)",
                self.peer,
                len(s.connections) - 1,
            )
            self._parser = None  # type: ignore[assignment]
            self._fail(
                ApiError(
                    503,
                    "too_many_connections",
                    f"the server holds its limit of {self._limits.max_connections} connections",
                    retry_after=1,
                    close=True,
                ),
                linger=True,
            )
            return
        if s.closing:
            self._closing = True
        self._arm("idle", self._limits.keepalive_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        s = self._server
        s.connections.discard(self)
        s.on_count(len(s.connections))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._req is not None and self._req.context is not None and not self._skipping:
            self._app.aborted(self._req, None)
        self._req = None
        for item in self._queue:
            resp = item[1]
            if resp is not None and resp.on_sent is not None:
                resp.on_sent("dropped", 0.0)
        self._transport = None

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._maybe_resume()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._deadline = min(self._linger_until, self._loop.time() + LINGER_IDLE_S)
            return
        if self._parser is None:  # answered a framing error: nothing more is read
            return
        req = self._req
        if req is None or req._head >= 0:  # in the head of a request (or between requests)
            if self._timeout_kind != "header":
                self._arm("header", self._limits.header_timeout_s)
        else:
            self._deadline = self._loop.time() + self._limits.body_timeout_s
        self._began = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Abort):
                log.error("HTTP callback failed for %s", self.peer, exc_info=exc.__context__ or exc)
                self._fail(
                    ApiError(
                        500, "internal_error", "the server failed to read this request", close=True
                    )
                )
            return
        except httptools.HttpParserUpgrade:
            self._closing = (
                True  # the request before the upgrade is answered; the rest is not HTTP/1.1
            )
            self._parser = None  # type: ignore[assignment]
            self._flush()
        except httptools.HttpParserInvalidMethodError:
            self._fail(
                ApiError(
                    405,
                    "method_not_allowed",
                    "the request method is not one this server knows; use GET, HEAD or POST",
                    close=True,
                ),
                {"Allow": "GET, HEAD, POST"},
            )
            return
        except httptools.HttpParserError as exc:
            self._fail(ApiError(400, "bad_request", f"malformed HTTP request: {exc}", close=True))
            return
        req = self._req
        if req is not None and req._head >= 0 and not self._began:
            # still in the head after a whole further chunk: llhttp buffers an unfinished header
            # line itself, so the head is bounded here (the callbacks count complete headers)
            req._head += len(data)
            if req._head > MAX_HEAD_BYTES:
                self._fail(
                    ApiError(
                        431,
                        "headers_too_large",
                        f"the request head exceeds {MAX_HEAD_BYTES} bytes",
                        close=True,
                    )
                )

    def eof_received(self) -> bool | None:
        if self._lingering:
            self._close()
            return None
        self._eof = True
        if self._req is not None and self._parser is not None:
            # half-closed in the middle of a request: say so (the client may still read)
            self._fail(
                ApiError(
                    400,
                    "bad_request",
                    "the connection ended before the request was complete",
                    close=True,
                )
            )
        elif not self._queue:
            self._close()
        return True  # keep the transport open to write the answers still queued

    # --- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._req = Request()
        self._began = True
        self._skipping = False
        if self._timeout_kind != "header":
            self._arm("header", self._limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        req = self._req
        assert req is not None
        req._url += url
        req._size += len(url)
        if req._size > MAX_HEAD_BYTES:
            self._fail(
                ApiError(
                    431,
                    "headers_too_large",
                    f"the request target exceeds {MAX_HEAD_BYTES} bytes",
                    close=True,
                )
            )
            raise _Abort

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self._req
        assert req is not None
        headers = req.headers
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        req._size += len(name) + len(value) + 4
        if len(headers) >= MAX_HEADERS or req._size > MAX_HEAD_BYTES:
            self._fail(
                ApiError(
                    431,
                    "headers_too_large",
                    f"more than {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes",
                    close=True,
                )
            )
            raise _Abort
        if key in headers:
            if key == "host":
                self._fail(ApiError(400, "bad_request", "more than one Host header", close=True))
                raise _Abort
            headers[key] = headers[key] + ", " + val
        else:
            headers[key] = val

    def on_headers_complete(self) -> None:
        req = self._req
        assert req is not None
        p = self._parser
        req.method = p.get_method().decode("ascii", "replace")
        req.version = p.get_http_version()
        req.keep_alive = p.should_keep_alive()
        req._head = -1  # the head is done: what follows is body
        try:
            url = httptools.parse_url(req._url)
        except httptools.HttpParserInvalidURLError:
            self._fail(
                ApiError(400, "bad_request", "the request target is not a valid URL", close=True)
            )
            raise _Abort from None
        req.path = url.path.decode("latin-1")
        req.query = (url.query or b"").decode("latin-1")
        if req.version not in ("1.1", "1.0"):
            self._fail(
                ApiError(
                    400,
                    "unsupported_http_version",
                    f"HTTP/{req.version} is not served; use HTTP/1.1",
                    close=True,
                )
            )
            raise _Abort
        if req.version == "1.1" and "host" not in req.headers:
            self._fail(
                ApiError(400, "bad_request", "HTTP/1.1 requests need a Host header", close=True)
            )
            raise _Abort
        if "transfer-encoding" in req.headers:
            self._fail(
                ApiError(
                    411,
                    "length_required",
                    "Transfer-Encoding is not accepted; send the body with Content-Length",
                    close=True,
                )
            )
            raise _Abort
        cl = req.headers.get("content-length")
        req.content_length = (
            int(cl) if cl is not None else 0
        )  # llhttp checked it is one run of digits
        early = self._app.on_headers(req)
        if early is not None:
            self._skipping = True
            self._queue.append([req, early, True])
            if (
                early.close
                or early.status == 413
                or req.content_length > EARLY_SKIP_BYTES
                or not req.keep_alive
            ):
                early.close = True
                if req.content_length:  # before the answer goes: its close must linger, not reset
                    self._start_lingering()
                self._flush()  # the close drops the parser and this request: nothing more is read
                raise _Abort
            self._flush()  # a small body follows: read and drop it, keep the connection
            if req.content_length:
                self._arm("body", self._limits.body_timeout_s)
            return
        if req.content_length:
            if (
                req.content_length > self._limits.max_body_bytes
            ):  # the app did not check: the edge does
                self._fail(
                    ApiError(
                        413,
                        "payload_too_large",
                        f"the body has {req.content_length} bytes",
                        close=True,
                    ),
                    linger=True,
                )
                raise _Abort
            if req.headers.get("expect", "").lower() == "100-continue" and not self._queue:
                assert self._transport is not None
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._arm("body", self._limits.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        if not self._skipping:
            req = self._req
            assert req is not None
            req.body += body

    def on_message_complete(self) -> None:
        req = self._req
        assert req is not None
        self._req = None
        if self._skipping:
            self._skipping = False
        else:
            self._queue.append([req, None, False])
            if len(self._queue) > MAX_PIPELINE:
                self._pause()
        self._arm("busy", 0)
        self._flush()

    # --- answering -----------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write every answer at the head of the queue that is ready; start the next request."""
        while self._queue:
            item = self._queue[0]
            req, resp, started = item
            if resp is None:
                if started:
                    return  # in progress
                item[2] = True
                try:
                    result = self._app.handle(req)
                except Exception as exc:  # a bug in the application: answer it, keep serving
                    bug, result = _internal_error(exc)
                    if req.context is not None:
                        self._app.aborted(req, bug)
                if isinstance(result, Response):
                    item[1] = resp = result
                else:
                    result.add_done_callback(functools.partial(self._done, item))
                    return
            self._queue.popleft()
            self._write(req, resp)
            if self._transport is None:
                return
        if self._closing or self._eof:
            if self._lingering:
                self._eof_then_linger()
            elif self._req is None:
                self._close()
            return
        self._maybe_resume()
        if self._req is None and not self._lingering:
            self._arm("idle", self._limits.keepalive_timeout_s)

    def _done(self, item: list[Any], fut: asyncio.Future[Response]) -> None:
        try:
            item[1] = fut.result()
        except Exception as exc:  # a bug in the application: say so, keep serving others
            item[1] = _internal_error(exc)[1]
        if self._transport is None:
            if item[1].on_sent is not None:
                item[1].on_sent("dropped", 0.0)
            return
        self._flush()

    def _write(self, req: Request | None, resp: Response) -> None:
        t = self._transport
        last = not self._queue
        close = (
            resp.close
            or (req is not None and not req.keep_alive)
            or ((self._closing or self._eof or self._server.closing) and last)
        )
        if t is None or t.is_closing():
            if resp.on_sent is not None:
                resp.on_sent("dropped", 0.0)
            return
        body = b"" if req is not None and req.method == "HEAD" else resp.body
        data = (
            _head(
                resp.status,
                resp.content_type,
                len(resp.body),
                resp.headers,
                close,
                self._server.clock.date(),
            )
            + body
        )
        if resp.on_sent is not None:
            resp.on_sent("sending", 0.0)
        t0 = time.perf_counter()
        t.write(data)
        if resp.on_sent is not None:
            resp.on_sent("written", time.perf_counter() - t0)
        if close:  # nothing may follow an answer that says close: drop what was queued behind it
            self._closing = True
            for item in self._queue:
                if item[1] is not None and item[1].on_sent is not None:
                    item[1].on_sent("dropped", 0.0)
                elif item[0] is not None and item[0].context is not None:
                    self._app.aborted(item[0], None)
            self._queue.clear()
            self._parser = None  # type: ignore[assignment]
            if self._req is not None and self._req.context is not None and not self._skipping:
                self._app.aborted(self._req, None)
            self._req = None

    def _fail(
        self, exc: ApiError, headers: dict[str, str] | None = None, linger: bool = False
    ) -> None:
        """A framing or limit error: answer it after the answers already due, then close
        (lingering when the client may still be sending a body)."""
        req = self._req
        if req is not None and req.context is not None and not self._skipping:
            self._app.aborted(req, exc)
        flat = req is not None and self._server.flat_errors(req.path or req._url.decode("latin-1"))
        self._req = None
        self._closing = True
        self._parser = None  # type: ignore[assignment] # nothing more is parsed on this connection
        self._queue.append([None, error_response(exc, headers, flat=flat), True])
        if linger:
            self._start_lingering()
        else:
            self._pause()
        self._flush()

    def _start_lingering(self) -> None:
        """Keep reading and dropping after the answer so the client can read it (RFC 9112 9.6)."""
        if self._transport is None:
            return
        self._lingering = True
        self._req = None
        self._maybe_resume(force=True)
        self._linger_until = self._loop.time() + LINGER_S
        self._arm("linger", LINGER_IDLE_S)
        if not self._queue:
            self._eof_then_linger()

    def _eof_then_linger(self) -> None:
        t = self._transport
        if t is not None and t.can_write_eof():
            t.write_eof()  # our side is done; a FIN, not a reset, follows the answer

    def _close(self) -> None:
        if self._lingering and self._transport is not None and not self._transport.is_closing():
            self._eof_then_linger()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()

    def quiesce(self, grace_s: float) -> None:
        """The server stops: answers from now on say close; an idle connection closes after
        `grace_s` unless a request arrives on it first (which is then answered and closed)."""
        self._closing = True
        if self._req is None and not self._queue and not self._lingering:
            self._arm("idle", grace_s)

    # --- flow control and timers ---------------------------------------------------------------

    def _pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _maybe_resume(self, force: bool = False) -> None:
        if (
            self._paused
            and self._transport is not None
            and (force or (not self._write_paused and len(self._queue) <= MAX_PIPELINE))
        ):
            self._paused = False
            self._transport.resume_reading()

    def _arm(self, kind: str, seconds: float) -> None:
        self._timeout_kind = kind
        if kind == "busy":  # a request in progress: the model's time is /livez's business
            self._deadline = float("inf")
            return
        self._deadline = self._loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        now = self._loop.time()
        if now < self._deadline:
            if self._deadline != float("inf"):
                self._timer = self._loop.call_at(self._deadline, self._on_timer)
            return
        kind = self._timeout_kind
        if kind == "header":
            self._fail(
                ApiError(
                    408,
                    "request_timeout",
                    f"the request headers did not arrive within {self._limits.header_timeout_s:g} s",
                    close=True,
                )
            )
        elif kind == "body":
            self._fail(
                ApiError(
                    408,
                    "request_timeout",
                    f"the body stalled for {self._limits.body_timeout_s:g} s",
                    close=True,
                )
            )
        else:  # idle keep-alive, or a lingering close that has waited long enough
            self._lingering = False
            self._close()


class HttpServer:
    """The listening socket and its event loop, in one thread ("torchfleet-http")."""

    def __init__(
        self,
        app: App,
        host: str,
        port: int,
        header_timeout_s: float,
        body_timeout_s: float,
        keepalive_timeout_s: float,
        max_connections: int,
        max_body_bytes: int,
        on_count: Callable[[int], None] = lambda n: None,
        ssl_context: ssl.SSLContext | None = None,
        sock: socket.socket | None = None,
        flat_errors: Callable[[str], bool] = lambda target: False,
    ) -> None:
        self.app = app
        # whether a framing, limit or timeout error on this request target (what of it has been
        # read) is answered in the flat form `{"error": "<message>"}` (server.py: the /v2 routes)
        self.flat_errors = flat_errors
        self._sock = sock  # a listening socket made elsewhere (an edge process inherits one)
        self.ssl_context = ssl_context  # HTTPS when set (tls.server_context)
        self.limits = _Limits(
            header_timeout_s, body_timeout_s, keepalive_timeout_s, max_connections, max_body_bytes
        )
        self.on_count = on_count
        self.clock = _Clock()
        self.connections: set[Connection] = set()
        self.closing = False
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._host, self._port = host, port
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> None:
        """Bind (raising OSError here, in the caller's thread, if the port is taken) and serve."""
        if self._sock is not None:
            made = self.loop.create_server(
                lambda: Connection(self), sock=self._sock, backlog=1024, ssl=self.ssl_context
            )
        else:
            made = self.loop.create_server(
                lambda: Connection(self),
                self._host,
                self._port,
                backlog=1024,
                reuse_address=True,
                ssl=self.ssl_context,
            )
        self._server = self.loop.run_until_complete(made)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="torchfleet-http", daemon=True
        )
        self._thread.start()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def call(self, fn: Callable[[], Any]) -> None:
        """Run fn in the server's loop (thread-safe)."""
        self.loop.call_soon_threadsafe(fn)

    def begin_closing(self) -> None:
        """Answers from now on carry Connection: close. Idle keep-alive connections stay open
        until stop(): closing one now would race a request the client is sending on it."""

        def run() -> None:
            self.closing = True

        self.call(run)

    def stop(self, timeout: float = 5.0, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop listening, close every connection, stop the loop and its thread. An idle
        keep-alive connection gets `grace_s` first: a request that was already on its way is
        answered (the app refuses it: 503, Connection: close) rather than reset."""
        if self._thread is None:
            return
        done = threading.Event()

        async def shutdown() -> None:
            assert self._server is not None
            self.closing = True
            self._server.close()
            for c in list(self.connections):
                c.quiesce(grace_s)
            deadline = self.loop.time() + grace_s
            while self.connections and self.loop.time() < deadline:
                await asyncio.sleep(0.01)
            for c in list(self.connections):
                if c._transport is not None:
                    c._transport.abort() if c._transport.is_closing() else c._transport.close()
            await asyncio.sleep(0)
            done.set()
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
        done.wait(timeout)
        self._thread.join(timeout)
        if not self.loop.is_running():
            self.loop.close()
        self._thread = None
