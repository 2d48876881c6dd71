"""The controller's client of a node's runtime: the one place infra speaks HTTP to it.

Contract: every request the controller sends a runtime (the `up` smoke stage, the readiness wait
and `status`, the demo's predictions) and every connection the load generator opens
(benchmarks/torchfleet_bench) is made here, so what all of them must send or check (an
Authorization header, TLS verification) is written once. It holds:
- `Auth`: what every request carries and checks: the stack's API token (`Authorization: Bearer`,
  added in `_exchange`, the one place a request leaves) and, for https, the CA file its certificate
  is verified against (None: the system's CAs; verification is never turned off);
- `Target`: a runtime's base URL ('http://h:8080', 'h:8080', a '/v1/predict' URL), its `Auth`
  and its keep-alive connections (TCP_NODELAY), which carry that `Auth`;
- `request`: one request on a fresh connection, (status, body, seconds), status None when
  nothing answered (refused, reset, timed out): the stages treat that as a state, not an error;
- `get_json`, `post_once`, `post_answer`: the model card (GET /v1/model) and one POST on a kept
  connection (`post_answer` also returns the answer's headers);
- `build_payload`, `card_payload`: a deterministic request body of the shape and dtype the
  model card names, as JSON `{"inputs": ...}` or raw little-endian bytes with X-Shape/X-Dtype.
Standard library only. Bad input raises `ClientError`: one line naming what was wrong.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import struct
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ClientError(Exception):
    """A problem the user can fix (a bad URL or dtype, an unreachable server): one line."""


@dataclass(frozen=True)
class Auth:
    """The API token to send (None: none) and the CA an https endpoint is checked against: a
    file, or PEM text (a stack's generated CA, its output infra.constants.CA_OUTPUT); neither: the
    system's CAs."""

    token: str | None = None
    cafile: str | None = None
    cadata: str | None = None

    def headers(self, given: dict[str, str] | None) -> dict[str, str]:
        out = dict(given or {})
        if self.token and not any(k.lower() == "authorization" for k in out):
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def ssl_context(self) -> ssl.SSLContext:
        """Verification on (hostname and chain), TLS 1.2 or newer."""
        ctx = ssl.create_default_context(cafile=self.cafile, cadata=self.cadata)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    """TCP_NODELAY, as wrk and other load generators set: with Nagle on, the tail segment of a
    large body can wait for the peer's delayed ACK (40 ms on Linux) and a latency would measure
    TCP timers instead of the server. `auth`: what `_exchange` adds to each request on it."""

    auth = Auth()

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    auth = Auth()

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class Target:
    scheme: str
    host: str
    port: int
    prefix: str  # path before /v1/..., usually ""
    auth: Auth = Auth()

    @classmethod
    def parse(cls, url: str, auth: Auth | None = None) -> Target:
        """'http://h:8080', 'http://h:8080/', 'http://h:8080/v1/predict' or 'h:8080'."""
        if "://" not in url:
            url = "http://" + url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"URL {url!r}: expected http://HOST:PORT")
        path = parts.path.rstrip("/")
        for suffix in ("/v1/predict", "/v1/model"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, path, auth or Auth())

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = _NoDelayHTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.auth.ssl_context()
            )
        else:
            conn = _NoDelayHTTPConnection(self.host, self.port, timeout=timeout)
        conn.auth = self.auth
        return conn

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


# -- requests -------------------------------------------------------------------------------------


def _exchange(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None,
) -> tuple[http.client.HTTPResponse, bytes]:
    """Every request leaves through here, with its connection's Auth: (the response, its body
    read fully, so the connection can be reused)."""
    auth: Auth = getattr(conn, "auth", Auth())
    conn.request(method, path, body=body, headers=auth.headers(headers))
    resp = conn.getresponse()
    return resp, resp.read()


def _once(
    target: Target,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None,
    timeout: float,
) -> tuple[int, bytes]:
    conn = target.connection(timeout)
    try:
        resp, data = _exchange(conn, method, target.prefix + path, body, headers)
        return resp.status, data
    finally:
        conn.close()


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
    auth: Auth | None = None,
) -> tuple[int | None, bytes, float]:
    """One request on a fresh connection: (status, body, seconds); (None, b"", seconds) when
    nothing answered. A certificate that does not verify is an error, never "nothing answered"."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = Target(parts.scheme, parts.hostname or "127.0.0.1", port, "", auth or Auth())
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    started = time.monotonic()
    try:
        status, data = _once(target, method, path, body, headers, timeout)
        return status, data, time.monotonic() - started
    except ssl.SSLCertVerificationError as exc:
        raise ClientError(
            f"{method} {url}: the certificate does not verify ({exc.verify_message})"
        ) from None
    except (OSError, http.client.HTTPException):
        return None, b"", time.monotonic() - started


def get_json(target: Target, path: str, timeout: float) -> dict[str, Any]:
    """GET `path` (the model card: /v1/model) as JSON; ClientError unless a 200 with JSON."""
    try:
        status, body = _once(target, "GET", path, None, None, timeout)
    except (OSError, http.client.HTTPException) as exc:
        raise ClientError(f"GET {target.url}{path}: {exc}") from None
    if status != 200:
        raise ClientError(f"GET {target.url}{path} answered {status}: {body[:300]!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise ClientError(
            f"GET {target.url}{path}: the answer is not JSON: {body[:200]!r}"
        ) from None


def post_once(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes, bool]:
    """One POST on a kept connection: (status, body, keep), keep False when the server asked
    to close it."""
    resp, data = _exchange(conn, "POST", path, body, headers)
    return resp.status, data, not resp.will_close


def post_answer(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    """One POST with its connection's Auth: (status, body, the answer's headers, lower-case
    names), for a caller that reads the answer's framing (the binary tensor extension)."""
    resp, data = _exchange(conn, "POST", path, body, headers)
    return resp.status, data, {k.lower(): v for k, v in resp.getheaders()}


# -- request bodies -------------------------------------------------------------------------------

# struct codes of the dtypes a body may carry (bfloat16: the high half of a float32)
DTYPE_CODES = {
    "float32": "f",
    "float64": "d",
    "float16": "e",
    "bfloat16": "f",
    "int64": "q",
    "int32": "i",
    "uint8": "B",
    "int8": "b",
    "bool": "?",
}


def check_dtype(name: str) -> str:
    if name not in DTYPE_CODES:
        raise ClientError(f"dtype {name!r} is not one of {', '.join(DTYPE_CODES)}")
    return name


def _prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def sample_values(count: int, dtype: str, seed: int = 0) -> list[Any]:
    """Deterministic inputs: floats in [0, 1) exactly representable in float32 (so JSON and
    binary carry the same tensor), integers in [0, 10), booleans."""
    rng = random.Random(seed)
    if dtype == "bool":
        return [rng.random() < 0.5 for _ in range(count)]
    if DTYPE_CODES[dtype] in "qiBb":
        return [rng.randrange(10) for _ in range(count)]
    return [
        rng.getrandbits(8) / 256.0 for _ in range(count)
    ]  # like pixels: exact in bfloat16 and float16 too


def pack(values: Sequence[Any], dtype: str) -> bytes:
    """Raw little-endian bytes of `values` as `dtype`, without numpy."""
    if sys.byteorder != "little":
        raise ClientError("the binary body is little-endian; this client runs on a big-endian CPU")
    data = struct.pack(f"<{len(values)}{DTYPE_CODES[dtype]}", *values)
    if dtype == "bfloat16":  # keep the high two bytes of each little-endian float32
        data = b"".join(data[i + 2 : i + 4] for i in range(0, len(data), 4))
    return data


def nest(flat: Sequence[Any], shape: Sequence[int]) -> Any:
    """A flat list reshaped into nested lists of `shape`."""
    if len(shape) <= 1:
        return list(flat)
    step = _prod(shape[1:])
    return [nest(flat[i : i + step], shape[1:]) for i in range(0, len(flat), step)]


def build_payload(
    shape: Sequence[int],
    dtype: str,
    batch: int,
    binary: bool,
    seed: int = 0,
    decimals: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for one POST /v1/predict of `batch` instances; `decimals` rounds the
    floats (a shorter JSON body, as clients that send rounded pixels do)."""
    full = (batch, *shape)
    values = sample_values(_prod(full), check_dtype(dtype), seed)
    if decimals is not None and DTYPE_CODES[dtype] in "fde":
        values = [round(v, decimals) for v in values]
    if binary:
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Shape": ",".join(str(d) for d in full),
            "X-Dtype": dtype,
        }
        return pack(values, dtype), headers
    body = json.dumps({"inputs": nest(values, full)}, separators=(",", ":")).encode()
    return body, {"Content-Type": "application/json"}


def input_spec(info: dict[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """(input_shape, dtype) from a /v1/model answer or a model.json sidecar."""
    found = info.get("input")
    nested: dict[str, Any] = found if isinstance(found, dict) else {}
    shape = info.get("input_shape") or info.get("shape") or nested.get("shape")
    dtype = info.get("dtype") or info.get("input_dtype") or nested.get("dtype")
    try:
        shape_t = tuple(int(d) for d in shape) if shape else None
    except (TypeError, ValueError):
        shape_t = None
    return shape_t, (str(dtype) if dtype else None)


def card_payload(card: dict[str, Any], batch: int, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A body of `batch` instances of what the model card says the model takes (float32 unless
    it names a dtype); ClientError when it names no input shape."""
    shape, dtype = input_spec(card)
    if not shape:
        raise ClientError("the model card (GET /v1/model) names no input shape")
    return build_payload(shape, dtype or "float32", batch, binary)
