"""The routes: HTTP requests turned into calls of the runtime's API and back.

Routes: POST /v1/predict, GET /v1/model, /livez, /readyz, /metrics, POST /admin/reload. Every
error is JSON {"error": {"type", "message"}} (httpd.error_response); client mistakes are 4xx.
The Open Inference Protocol (v2.py): GET /v2, /v2/health/live|ready, /v2/models/{name}
[/versions/{v}][/ready] and POST /v2/models/{name}[/versions/{v}]/infer, whose errors are
{"error": "<message>"} as Triton writes them, those the connection layer answers before a route
is chosen (malformed HTTP, 408, 431, 413) included whenever the target read so far is a /v2 path
(httpd's `flat_errors`). An infer request is a prediction like /v1's (the same call, batcher,
limits, auth, ids, timing and metrics, the latter under its own `route` label: v2.V2_ROUTE) with
v2.V2Infer as its codec.
This module knows the runtime only through `RuntimeApi` (predict, status, reload, and the
metrics exposition); it never touches the batcher, the loaded model or the metric objects.

Headers: every /v1/predict answer carries `X-Request-Id` (the client's when it sent a sane one:
1-128 of A-Z a-z 0-9 . _ : / + = @ -, else a new one) and `X-Model-Version` once a model is
loaded; a 200 carries `Server-Timing: decode;dur=, queue;dur=, model;dur=, encode;dur=` (ms).
Auth: with `api_token` or `api_token_file` set, /v1/* and /v2/* (but /v2/health/*) need
`Authorization: Bearer <token>` with one of the accepted tokens (auth.py; 401 otherwise);
/admin/* always needs `admin_token` and is 403 while none is configured; POST /admin/reload
re-reads the token file too. Health and metrics stay open: load balancers and the scraper reach
them from inside the network, which the security groups bound. With `tls_cert_file` the edge
speaks HTTPS (tls.py).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import socket
from typing import Any, Callable, Mapping, Protocol

from . import __version__, v2
from .auth import Tokens
from .config import Config
from .errors import ApiError, internal_error
from .httpd import HttpServer, Request, Response, error_response
from .tls import server_context
from .v2 import V2Infer
from .wire import JSON_TYPES, MEDIA_TYPES, dumps, media_type

log = logging.getLogger(__name__)

ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/predict": ("POST",),
    "/v1/model": ("GET", "HEAD"),
    "/livez": ("GET", "HEAD"),
    "/readyz": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
    "/admin/reload": ("POST",),
}
_BODY_TYPES = (*JSON_TYPES, "application/octet-stream", "application/x-npy")
_V2_BODY_TYPES = (*JSON_TYPES, "application/octet-stream")
# /v2/models/{name}[/versions/{version}][/ready|/infer]
_V2_MODEL = re.compile(r"/v2/models/([^/]{1,256})(?:/versions/([^/]{1,256}))?(/ready|/infer)?")
_V2_OPEN = ("/v2/health/live", "/v2/health/ready")
_SANE_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Call(Protocol):
    """One prediction as the routes drive it: predict.PredictCall in a single-process runtime,
    edge.EdgeCall in an edge process."""

    @property
    def request_id(self) -> str: ...

    @property
    def version(self) -> str | None: ...

    @property
    def model_name(self) -> str | None: ...

    protocol: V2Infer | None  # set on a /v2 infer request: its codec instead of /v1's

    def check_ready(self) -> None: ...

    def expect(self) -> None: ...

    def submit(
        self, body: bytes | bytearray, content_type: str, headers: Mapping[str, str]
    ) -> None: ...

    def add_done_callback(self, fn: Callable[[], object]) -> None: ...

    def answer(self, accept: str) -> tuple[bytes, str, dict[str, str]]: ...

    def wrote(self, write_s: float) -> None: ...

    def finish(self, status: int, error: ApiError | None = None) -> None: ...


class RuntimeApi(Protocol):
    def predict(self, request_id: str) -> Call: ...

    def status(self, detail: bool = False) -> dict[str, Any]: ...

    def reload(self, reason: str) -> dict[str, Any]: ...

    def metrics_text(self) -> bytes: ...


def request_id(headers: dict[str, str]) -> str:
    given = headers.get("x-request-id")
    if given is not None and _SANE_ID.fullmatch(given):
        return given
    return os.urandom(8).hex()


def _token_ok(headers: dict[str, str], token: str) -> bool:
    auth = headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, dumps(doc), headers=headers)


class Routes:
    """The application `httpd` serves (its `App` protocol)."""

    def __init__(self, runtime: RuntimeApi, config: Config, tokens: Tokens) -> None:
        self.rt = runtime
        self.tokens = tokens
        self.admin_token = config.admin_token
        self.max_body_bytes = int(config.max_body_mb * 2**20)
        self.loop: asyncio.AbstractEventLoop | None = None  # set by serve()

    # --- App: decisions from the headers -----------------------------------------------------

    def on_headers(self, req: Request) -> Response | None:
        if v2.is_v2_path(req.path):
            return self._v2_headers(req)
        methods = ROUTES.get(req.path)
        if methods is None:
            return error_response(
                ApiError(
                    404, "not_found", f"no route {req.path[:200]!r}; routes: {', '.join(ROUTES)}"
                )
            )
        if req.method not in methods:
            return error_response(
                ApiError(
                    405,
                    "method_not_allowed",
                    f"{req.method} is not allowed on {req.path}; use {' or '.join(methods)}",
                ),
                {"Allow": ", ".join(methods)},
            )
        if req.path.startswith("/admin/"):
            return self._admin_auth(req)
        if req.path == "/v1/predict":
            return self._predict_headers(req)
        if req.path.startswith("/v1/") and not self.tokens.accepts(req.headers):
            return self._unauthorized("api_token", "torchfleet")
        return None

    def _unauthorized(
        self,
        key: str,
        realm: str,
        on_sent: Callable[[str, float], None] | None = None,
        headers: dict[str, str] | None = None,
        flat: bool = False,
    ) -> Response:
        return error_response(
            ApiError(401, "unauthorized", f"send Authorization: Bearer <{key}>"),
            {**(headers or {}), "WWW-Authenticate": f'Bearer realm="{realm}"'},
            on_sent,
            flat,
        )

    def _admin_auth(self, req: Request) -> Response | None:
        if not self.admin_token:
            return error_response(
                ApiError(403, "forbidden", "the admin API is off: set the config key admin_token")
            )
        if not _token_ok(req.headers, self.admin_token):
            return self._unauthorized("admin_token", "torchfleet-admin")
        return None

    def _predict_headers(self, req: Request, infer: V2Infer | None = None) -> Response | None:
        call = self.rt.predict(request_id(req.headers))
        call.protocol = infer
        req.context = call
        if not self.tokens.accepts(req.headers):
            return self._unauthorized(
                "api_token", "torchfleet", self._sent(call, 401), self._ids(call), infer is not None
            )
        try:
            call.check_ready()
            if infer is not None:
                v2.check_model(infer.model, infer.version, call.model_name or "", call.version)
            if req.content_length > self.max_body_bytes:
                raise ApiError(
                    413,
                    "payload_too_large",
                    f"the body has {req.content_length} bytes; the limit is "
                    f"{self.max_body_bytes} (config key max_body_mb)",
                )
            ctype = media_type(req.headers.get("content-type", ""))
            if ctype not in (_BODY_TYPES if infer is None else _V2_BODY_TYPES):
                raise ApiError(
                    415,
                    "unsupported_media_type",
                    f"Content-Type {ctype[:100]!r} is not supported; use {MEDIA_TYPES}",
                )
        except ApiError as exc:
            return self._error(call, exc)
        call.expect()
        return None

    # --- App: whole requests -----------------------------------------------------------------

    def handle(self, req: Request) -> Response | asyncio.Future[Response]:
        path = req.path
        if path == "/v1/predict" or req.context is not None:  # /v1 or /v2 infer
            return self._predict(req)
        if v2.is_v2_path(path):
            try:
                return self._v2(path)
            except ApiError as exc:
                return error_response(exc, flat=True)
        if path == "/readyz":
            st = self.rt.status()
            if st["ready"]:
                return _json(200, {"status": "ready"})
            if st.get("not_ready"):  # degraded: which replicas fail, and why
                return error_response(ApiError(503, "degraded", st["not_ready"], st["retry_after"]))
            return error_response(
                ApiError(503, "not_ready", f"the runtime is {st['state']}", st["retry_after"])
            )
        if path == "/livez":
            st = self.rt.status()
            if st["alive"]:
                return _json(200, {"status": "alive"})
            return error_response(ApiError(503, "not_alive", st["reason"], 5))
        if path == "/v1/model":
            st = self.rt.status(detail=True)
            if st["model"] is None:
                return error_response(
                    ApiError(503, "not_ready", f"the runtime is {st['state']}", st["retry_after"])
                )
            return _json(200, st["model"])
        if path == "/metrics":
            return Response(200, self.rt.metrics_text(), METRICS_TYPE)
        return self._reload()

    def aborted(self, req: Request, exc: ApiError | None) -> None:
        call: Call | None = req.context
        if call is not None:
            call.finish(exc.status if exc is not None else 499, error=exc)

    # --- predict -------------------------------------------------------------------------------

    @staticmethod
    def _ids(call: Call) -> dict[str, str]:
        h = {"X-Request-Id": call.request_id}
        if call.version:
            h["X-Model-Version"] = call.version
        return h

    @staticmethod
    def _sent(call: Call, status: int, exc: ApiError | None = None) -> Callable[[str, float], None]:
        def sent(event: str, write_s: float) -> None:
            if event == "sending":
                call.finish(status, error=exc)  # counted before the bytes leave
            elif event == "written":
                call.wrote(write_s)
            else:
                call.finish(499, error=exc)  # the client left first (nginx's code for it)

        return sent

    def _error(self, call: Call, exc: ApiError) -> Response:
        return error_response(
            exc, self._ids(call), self._sent(call, exc.status, exc), call.protocol is not None
        )

    def _predict(self, req: Request) -> Response | asyncio.Future[Response]:
        call: Call = req.context
        try:
            call.submit(req.body, req.headers.get("content-type", ""), req.headers)
        except ApiError as exc:
            return self._error(call, exc)
        loop = self.loop
        assert loop is not None
        fut: asyncio.Future[Response] = loop.create_future()
        accept = req.headers.get("accept", "")
        call.add_done_callback(lambda: loop.call_soon_threadsafe(self._answer, fut, call, accept))
        return fut

    def _answer(self, fut: asyncio.Future[Response], call: Call, accept: str) -> None:
        try:
            body, ctype, headers = call.answer(accept)
        except ApiError as exc:
            fut.set_result(self._error(call, exc))
            return
        except Exception as exc:  # a bug in encoding: the answer must still come, and count
            log.error("answering a prediction failed", exc_info=exc)
            fut.set_result(self._error(call, internal_error(exc)))
            return
        headers.update(self._ids(call))
        fut.set_result(Response(200, body, ctype, headers, on_sent=self._sent(call, 200)))

    # --- the Open Inference Protocol (v2.py) ---------------------------------------------------

    def _v2_headers(self, req: Request) -> Response | None:
        path = req.path
        m = _V2_MODEL.fullmatch(path)
        infer = m is not None and m.group(3) == "/infer"
        if not (infer or m is not None or path == "/v2" or path in _V2_OPEN):
            return error_response(v2.not_found(f"no route {path[:200]!r}"), flat=True)
        methods = ("POST",) if infer else ("GET", "HEAD")
        if req.method not in methods:
            return error_response(
                ApiError(
                    405,
                    "method_not_allowed",
                    f"{req.method} is not allowed on {path[:200]}; use {' or '.join(methods)}",
                ),
                {"Allow": ", ".join(methods)},
                flat=True,
            )
        if infer:
            assert m is not None
            return self._predict_headers(req, v2.V2Infer(m.group(1), m.group(2)))
        if path not in _V2_OPEN and not self.tokens.accepts(req.headers):
            return self._unauthorized("api_token", "torchfleet", flat=True)
        return None

    def _v2(self, path: str) -> Response:
        """The /v2 GET routes: health, server and model metadata, model readiness."""
        st = self.rt.status()
        if path == "/v2/health/live":
            return Response(200 if st["alive"] else 503, b"")
        if path == "/v2/health/ready":
            return Response(200 if st["ready"] else 503, b"")
        if path == "/v2":
            return _json(200, v2.server_metadata(__version__))
        m = _V2_MODEL.fullmatch(path)
        assert m is not None
        card = self.rt.status(detail=True)["model"]
        if card is None:
            raise ApiError(503, "not_ready", f"the runtime is {st['state']}", st["retry_after"])
        v2.check_model(m.group(1), m.group(2), card["name"], card["model_version"])
        if m.group(3) == "/ready":
            return Response(200 if st["ready"] else 503, b"")
        return _json(200, v2.model_metadata(card))

    # --- admin ---------------------------------------------------------------------------------

    def _reload(self) -> asyncio.Future[Response]:
        loop = self.loop
        assert loop is not None
        out: asyncio.Future[Response] = loop.create_future()
        self.tokens.reload()
        job = loop.run_in_executor(None, self.rt.reload, "POST /admin/reload")

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(_json(200, f.result()))
            elif isinstance(exc, ApiError):
                out.set_result(error_response(exc))
            else:
                log.error("reload failed", exc_info=exc)
                out.set_result(error_response(internal_error(exc, close=False)))

        job.add_done_callback(done)
        return out


def build_http(
    runtime: RuntimeApi,
    config: Config,
    tokens: Tokens,
    on_count: Any = lambda n: None,
    sock: socket.socket | None = None,
) -> HttpServer:
    routes = Routes(runtime, config, tokens)
    http = HttpServer(
        routes,
        config.host,
        config.port,
        config.header_timeout_s,
        config.body_timeout_s,
        config.keepalive_timeout_s,
        config.max_connections,
        routes.max_body_bytes,
        on_count,
        server_context(config),
        sock,
        v2.is_v2_path,
    )
    routes.loop = http.loop
    return http
