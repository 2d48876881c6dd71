#!/usr/bin/env python3
"""Fuzz and desync suite for the runtime's HTTP edge, over raw sockets.

Generated cases (seeded, reproducible), each sent on its own connection, then half-closed:
- mutations of valid requests (JSON, raw and .npy predictions, GETs): flipped, inserted and
  deleted bytes, truncations, bare LF / bare CR line ends, duplicated and hostile header lines;
- desync attempts: every pairing of framing headers (Content-Length twice, CL with
  Transfer-Encoding in both orders, obfuscated TE spellings, signs, hex, spaces, folds) with a
  second request smuggled behind the body that carries a canary value;
- hostile bodies: JSON nested up to 100 000 deep, NaN/Infinity, 1e999, huge integers, invalid
  UTF-8, wrong types, ragged and empty lists; hostile .npy headers (bad magic, versions,
  lengths past the body, deep tuples, negative/huge shapes, non-string descr, fortran order);
  hostile X-Shape / X-Dtype values; Open Inference Protocol bodies (/v2 infer): binary header
  lengths and binary_data_size values that lie, truncated tensors, JSON headers past the cap;
- slow clients alongside (slowloris heads dripping a byte at a time, stalled uploads).
Checked for every answer: a status line; no 5xx; every 4xx/5xx a JSON error
{"error": {"type", "message"}} ({"error": "<message>"} on /v2, the protocol's form); every 200
strict JSON (no NaN token); a smuggled request (its
own canary value) reaches the model only when the server also answered it as a request of its
own; the server answers a valid request after every `probe_every` cases; every slow client
ends with a 408.

    python tests/runtime/fuzz_http.py --cases 200000 [--seed 7] [--workers 8]   (the long run)
tests/runtime/test_fuzz.py runs a bounded version in `make test`.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import orjson  # noqa: E402
import rt_models  # noqa: E402
from rt_helpers import RawResponse, parse_responses  # noqa: E402

CANARY = rt_models.CANARY
SHAPE = (4,)


def _req(method: str, path: str, body: bytes = b"", headers: list[str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz"] + (headers or [])
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _npy(header: bytes, payload: bytes = b"\0" * 16, version: int = 1) -> bytes:
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(header)) + header + payload


V2_INFER = "/v2/models/model/infer"


def _v2_json(data: Any, shape: Any = (1, 4), datatype: str = "FP32", **extra: Any) -> bytes:
    inp = {"name": "input", "datatype": datatype, "shape": list(shape), "data": data}
    return orjson.dumps({"inputs": [inp], **extra})


def _v2_binary(
    tensor: bytes,
    size: Any = None,
    shape: Any = (1, 4),
    header_length: Any = None,
    binary_output: bool = False,
) -> tuple[bytes, list[str]]:
    """A binary-extension body (JSON header + tensor bytes) and its headers; `size` and
    `header_length` default to the truth and may lie."""
    inp = {
        "name": "input",
        "datatype": "FP32",
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "parameters": {"binary_data_size": len(tensor) if size is None else size},
    }
    doc: dict[str, Any] = {"inputs": [inp]}
    if binary_output:
        doc["parameters"] = {"binary_data_output": True}
    head = orjson.dumps(doc)
    hlen = len(head) if header_length is None else header_length
    return head + tensor, [
        "Content-Type: application/octet-stream",
        f"Inference-Header-Content-Length: {hlen}",
    ]


def _v2_req(body: bytes, headers: list[str] | None = None) -> bytes:
    return _req("POST", V2_INFER, body, headers or ["Content-Type: application/json"])


def v2_cases() -> Iterator[tuple[str, bytes]]:
    """Open Inference Protocol bodies: header lengths and binary_data_size values that lie,
    truncated tensors, JSON headers past the cap, hostile JSON requests."""
    t = struct.pack("<4f", 1, 2, 3, 4)
    for hlen in (0, 1, 5, -1, "x", "1e3", " 12", "99999999999999999999", 10**6, 10**12):
        yield "v2-binary", _v2_req(*_v2_binary(t, header_length=hlen))
    body, headers = _v2_binary(t)
    true_len = len(body) - len(t)
    for delta in (-1, 1, 4, 16):  # the JSON header ends early or runs into the tensor
        yield "v2-binary", _v2_req(*_v2_binary(t, header_length=true_len + delta))
    for size in (0, 1, 15, 17, 64, -16, 16.0, "16", 2**63, [16], True):
        yield "v2-binary", _v2_req(*_v2_binary(t, size=size))
    for cut in (1, 4, 15):  # truncated tensors, the header telling the truth about the rest
        yield "v2-binary", _v2_req(*_v2_binary(t[:-cut], size=16))
        yield "v2-binary", _v2_req(*_v2_binary(t[:-cut]))
    yield "v2-binary", _v2_req(*_v2_binary(t + t))  # two rows' bytes for one row's shape
    yield "v2-binary", _v2_req(*_v2_binary(t + b"\0" * 7, size=16))  # bytes after the input
    yield "v2-binary", _v2_req(*_v2_binary(struct.pack("<4f", float("nan"), 0, 0, 0)))
    for shape in ((1, 4, 1), (4,), (0, 4), (-1, 4), (2**41, 4), (1,) * 40, "1,4", None):
        yield "v2-binary", _v2_req(*_v2_binary(t, shape=shape))
    # a JSON header past the cap (binary requests carry their tensors after it)
    pad = b" " * (70 * 1024)
    big = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], ' + pad
    big += b'"parameters": {"binary_data_size": 16}}]}'
    yield (
        "v2-binary",
        _v2_req(
            big + t,
            [
                "Content-Type: application/octet-stream",
                f"Inference-Header-Content-Length: {len(big)}",
            ],
        ),
    )
    for doc in (
        _v2_json([1, 2, 3]),
        _v2_json([[1, 2], [3, 4]]),
        _v2_json([[1, 2, 3, 4]], shape=(2, 4)),
        _v2_json([1, 2, 3, 4], datatype="FP64"),
        _v2_json([1, 2, 3, 4], datatype="BYTES"),
        _v2_json([1, 2, 3, 4], datatype=None),
        _v2_json(["1", 2, 3, 4]),
        _v2_json([1e999, 2, 3, 4]),
        _v2_json(None),
        _v2_json([1, 2, 3, 4], outputs=[{"name": "nope"}]),
        _v2_json([1, 2, 3, 4], outputs=[{"name": "output", "parameters": {"binary_data": 1}}]),
        _v2_json([1, 2, 3, 4], outputs=[{"name": "output", "parameters": {"classification": 2}}]),
        _v2_json([1, 2, 3, 4], outputs="all"),
        _v2_json([1, 2, 3, 4], id=7),
        _v2_json([1, 2, 3, 4], parameters=[1]),
        b'{"inputs": []}',
        b'{"inputs": [{"name": "input"}, {"name": "input"}]}',
        b'{"inputs": [1, 2, 3, 4]}',
        b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b"[]",
        b"",
    ):
        yield "v2-json", _v2_req(doc)
    for path in (
        "/v2/models/other/infer",
        "/v2/models/model/versions/x/infer",
        "/v2/models//infer",
    ):
        yield (
            "v2-json",
            _req("POST", path, _v2_json([1, 2, 3, 4]), ["Content-Type: application/json"]),
        )


def valid_requests() -> list[bytes]:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ones((2, 4), dtype="<f4"))
    return [
        _req(
            "POST", "/v1/predict", b'{"inputs": [1, 2, 3, 4]}', ["Content-Type: application/json"]
        ),
        _req(
            "POST",
            "/v1/predict",
            b'{"inputs": [[1, 2, 3, 4], [0.5, 0, 0, 1]]}',
            ["Content-Type: application/json"],
        ),
        _req(
            "POST",
            "/v1/predict",
            struct.pack("<4f", 1, 2, 3, 4),
            ["Content-Type: application/octet-stream", "X-Shape: 1,4", "X-Dtype: float32"],
        ),
        _req(
            "POST",
            "/v1/predict",
            buf.getvalue(),
            ["Content-Type: application/x-npy", "Accept: application/octet-stream"],
        ),
        _v2_req(_v2_json([1, 2, 3, 4])),
        _v2_req(*_v2_binary(struct.pack("<4f", 1, 2, 3, 4), binary_output=True)),
        _req("GET", "/v2/models/model"),
        _req("GET", "/v2/health/ready"),
        _req("GET", "/v1/model"),
        _req("GET", "/readyz"),
        _req("GET", "/livez"),
        _req("HEAD", "/v1/model"),
    ]


HOSTILE_HEADERS = [
    "Transfer-Encoding: chunked",
    "Transfer-Encoding : chunked",
    "Transfer-Encoding:\tchunked",
    "Transfer-Encoding: xchunked",
    "Transfer-Encoding: chunked, identity",
    "transfer-encoding: CHUNKED",
    "Content-Length: 0",
    "Content-Length: 1",
    "Content-Length: -1",
    "Content-Length: 1.5",
    "Content-Length:",
    "Content-Length: 18446744073709551616",
    "Connection: close",
    "Connection: keep-alive, Upgrade",
    "Upgrade: h2c",
    "Expect: 100-continue",
    "Expect: garbage",
    "Host: other",
    "X-Shape: -1",
    "X-Shape: 99999999999999,4",
    "X-Shape: " + "1," * 500,
    "X-Dtype: complex128",
    "X-Dtype: ../../etc",
    "Content-Type: application/x-npy",
    "Content-Type: application/octet-stream",
    "Content-Type: text/html; charset=\xff",
    "Authorization: Bearer x",
    "X-Request-Id: " + "r" * 400,
    "X-Request-Id: \x7f\x01",
    "Accept: application/octet-stream",
    "X-Long: " + "v" * 9000,
    "\x00: nul",
    ": empty-name",
    "Bad Header: space",
    "Folded: a\r\n b",
]

FRAMINGS = [
    ["Content-Length: 5", "Content-Length: 5"],
    ["Content-Length: 5", "Content-Length: 6"],
    ["Content-Length: 5", "Transfer-Encoding: chunked"],
    ["Transfer-Encoding: chunked", "Content-Length: 5"],
    ["Transfer-Encoding: chunked"],
    ["Transfer-Encoding: chunked", "Transfer-Encoding: identity"],
    ["Transfer-Encoding: identity, chunked"],
    ["Transfer-Encoding : chunked", "Content-Length: 5"],
    ["Transfer-Encoding: \x0bchunked", "Content-Length: 5"],
    ["Transfer-Encoding:\tchunked"],
    ["Content-Length: +5"],
    ["Content-Length: 5 5"],
    ["Content-Length: 0x5"],
    ["Content-Length: 05"],
    [" Content-Length: 5"],
    ["Content-Length: 5", " 6"],
    ["Content-Length:\t5"],
    ["Content-Length: 5,5"],
    ["Content-Length: 5\rContent-Length: 80"],
    ["Content-Length: 5\nTransfer-Encoding: chunked"],
    ["X: y\r\nTransfer-Encoding: chunked"],
    ["Content-Length: 5", "Transfer-Encoding: gzip"],
]


def smuggled(mark: float) -> bytes:
    body = json.dumps({"inputs": [mark, 0, 0, 0]}).encode()
    return _req("POST", "/v1/predict", body, ["Content-Type: application/json"])


def desync_cases() -> Iterator[tuple[str, bytes]]:
    """Each case smuggles a request carrying its own canary value, CANARY + its index."""
    k = 0
    for framing in FRAMINGS:
        head = (
            "POST /v1/predict HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
            + "\r\n".join(framing)
        )
        for tail in (
            b"0\r\n\r\n",
            b"hello",
            b"5\r\nhello\r\n0\r\n\r\n",
            b"",
            b'{"inputs": [1, 2, 3, 4]}',
        ):
            yield "desync", (head + "\r\n\r\n").encode("latin-1") + tail + smuggled(CANARY + k)
            k += 1


def _json_body(doc: bytes) -> bytes:
    return _req("POST", "/v1/predict", doc, ["Content-Type: application/json"])


def body_cases(rng: random.Random) -> Iterator[tuple[str, bytes]]:
    for depth in (10, 100, 1000, 1025, 5000, 100_000):
        yield "deep-json", _json_body(b'{"inputs": ' + b"[" * depth + b"1" + b"]" * depth + b"}")
        yield "deep-json", _json_body(b'{"inputs": ' + b"[" * depth + b"}")
        yield (
            "deep-json",
            _json_body(
                b'{"inputs": [1, 2, 3, 4], "x": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
            ),
        )
    for doc in (
        b'{"inputs": [NaN, 1, 2, 3]}',
        b'{"inputs": [Infinity, 1, 2, 3]}',
        b'{"inputs": [1e999, 1, 2, 3]}',
        b'{"inputs": [-1e999, 1, 2, 3]}',
        b'{"inputs": [' + b"9" * 5000 + b", 1, 2, 3]}",
        b'{"inputs": [1, 2, 3, 4]',
        b'{"inputs": "1234"}',
        b'{"inputs": null}',
        b'{"inputs": {}}',
        b'{"inputs": [true, false, true, false]}',
        b'{"inputs": [[1, 2], [3]]}',
        b'{"inputs": [[], []]}',
        b'{"inputs": [1, "2", 3, 4]}',
        b'{"inputs": [1, 2, 3, 4], "inputs": [5]}',
        b"\xff\xfe{}",
        b'{"inputs": [1, 2, 3, 4]}\x00',
        b"[" * 3 + b"]" * 3,
        b'"just a string"',
        b"{}",
        b"null",
        b'{"inputs": [' + b"1," * 100_000 + b"1]}",
        b'{"inputs": [[1, 2, 3, 4]' + b", [1, 2, 3, 4]" * 5000 + b"]}",
        b'{"inputs": [1, 2, 3, 4], "x": "\\ud800"}',
        b'{"inputs": [1.0e-400, 0, 0, 0]}',
    ):
        yield "json-body", _json_body(doc)
    headers_f4 = ["Content-Type: application/x-npy"]
    for header in (
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
        b"{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }",
        b"{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }",
        b"{'descr': '<c16', 'fortran_order': False, 'shape': (4,), }",
        b"{'descr': 4, 'fortran_order': False, 'shape': (4,), }",
        b"{'descr': '<f4', 'fortran_order': 'no', 'shape': (4,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4.0,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': " + b"(" * 5000 + b")" * 5000 + b", }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': [4], }",
        b"{'descr': '<f4', 'fortran_order': False}",
        b"[1, 2, 3]",
        b"{" * 10000,
        b"__import__('os')",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': " + b"9" * 5000 + b"}",
        "{'descr': '<f4\u00e9', 'fortran_order': False, 'shape': (4,), }".encode("utf-8"),
        b"\xff" * 50,
    ):
        yield "npy-header", _req("POST", "/v1/predict", _npy(header), headers_f4)
        yield "npy-header", _req("POST", "/v1/predict", _npy(header, version=2), headers_f4)
    for raw in (
        b"\x93NUMPY\x09\x00\x10\x00",
        b"\x93NUMPY\x01\x00\xff\xff{",
        b"\x93NUMPY\x02\x00\xff\xff\xff\xff{",
        b"\x93NUMP",
        b"NOTNUMPY" * 4,
        _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", b"\0" * 3),
    ):
        yield "npy-header", _req("POST", "/v1/predict", raw, headers_f4)
    for shape, dtype, n in (
        ("4", "float32", 16),
        ("1,4", "float64", 32),
        ("99999999999999,4", "float32", 16),
        ("-1,4", "float32", 16),
        ("1,,4", "float32", 16),
        ("a,b", "float32", 16),
        ("0,4", "float32", 0),
        ("1,4", "bfloat16", 8),
        ("1,4", "float32", 15),
        ("1," * 40 + "4", "float32", 16),
        ("1,4", "", 16),
        ("", "float32", 16),
        ("1,4", "FLOAT32", 16),
    ):
        body = bytes(rng.getrandbits(8) for _ in range(n))
        headers = [
            "Content-Type: application/octet-stream",
            f"X-Shape: {shape}",
            f"X-Dtype: {dtype}",
        ]
        yield "raw-body", _req("POST", "/v1/predict", body, headers)
    yield (
        "raw-body",
        _req(
            "POST",
            "/v1/predict",
            struct.pack("<4f", float("nan"), 0, 0, 0),
            ["Content-Type: application/octet-stream", "X-Shape: 4", "X-Dtype: float32"],
        ),
    )


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip a byte
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 1:  # insert random bytes
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and b:  # delete a span
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 3:  # truncate
            del b[pos:]
        elif op == 4:  # line ends: bare LF or bare CR
            b = bytearray(
                bytes(b).replace(
                    b"\r\n", rng.choice([b"\n", b"\r", b"\r\r\n", b"\n\r"]), rng.randint(1, 3)
                )
            )
        elif op == 5:  # a hostile header line
            idx = bytes(b).find(b"\r\n")
            if idx > 0:
                b[idx + 2 : idx + 2] = (rng.choice(HOSTILE_HEADERS) + "\r\n").encode("latin-1")
        elif op == 6:  # duplicate a line
            lines = bytes(b).split(b"\r\n")
            if len(lines) > 2:
                i = rng.randrange(1, len(lines) - 1)
                lines.insert(i, lines[i])
                b = bytearray(b"\r\n".join(lines))
        elif op == 7:  # another method or path
            sp = bytes(b).find(b" ")
            if sp > 0:
                b[:sp] = rng.choice(
                    [
                        b"GET",
                        b"PUT",
                        b"DELETE",
                        b"PATCH",
                        b"OPTIONS",
                        b"TRACE",
                        b"CONNECT",
                        b"BREW",
                        b"get",
                        b"POST\x00",
                        b"",
                    ]
                )
        else:  # version games
            b = bytearray(
                bytes(b).replace(
                    b"HTTP/1.1",
                    rng.choice(
                        [
                            b"HTTP/1.0",
                            b"HTTP/2",
                            b"HTTP/0.9",
                            b"HTTP/1.1 x",
                            b"HTTP/9.9",
                            b"http/1.1",
                        ]
                    ),
                    1,
                )
            )
    return bytes(b)


def generate(seed: int, n: int) -> Iterator[tuple[str, bytes]]:
    """n cases: the fixed desync and body lists first, then seeded mutations to fill up."""
    rng = random.Random(seed)
    fixed = list(desync_cases()) + list(body_cases(rng)) + list(v2_cases())
    # mutations start from valid requests and hostile bodies, not from the desync cases: a mutated
    # smuggling case may well become two honest requests, and its canary would then mislead
    base = valid_requests() + [c[1] for c in fixed[::7] if c[0] != "desync"]
    for i in range(n):
        if i < len(fixed):
            yield fixed[i]
        else:
            yield "mutation", mutate(rng, rng.choice(base))


def canary_of(data: bytes) -> float | None:
    """The canary value a desync case smuggles (None for other cases)."""
    i = data.rfind(b'{"inputs": [')
    if i < 0:
        return None
    try:
        v = float(data[i + 12 :].split(b",", 1)[0])
    except ValueError:
        return None
    return v if v >= CANARY else None


def _exchange(port: int, data: bytes, timeout: float) -> tuple[bytes, bool]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            return got, False
    return got, True


def violations(kind: str, data: bytes, got: bytes, closed: bool) -> list[str]:
    if not got:
        return [] if not data.strip() else [f"{kind}: no answer at all (closed={closed})"]
    if data.startswith(
        b"HEAD "
    ):  # no body follows a HEAD answer's Content-Length: check the head only
        status = got.split(b"\r\n", 1)[0]
        ok = status.startswith(b"HTTP/1.1 ") and status[9:12].isdigit() and int(status[9:12]) < 500
        return [] if ok and b"\r\n\r\n" in got else [f"{kind}: HEAD answer {got[:120]!r}"]
    try:
        responses: list[RawResponse] = parse_responses(got)
    except Exception as exc:  # an answer llhttp cannot parse is a broken status line
        return [f"{kind}: unparseable answer {got[:120]!r} ({exc})"]
    if not responses:
        return [f"{kind}: no complete answer in {got[:120]!r}"]
    out = []
    for r in responses:
        if r.status >= 500:
            out.append(f"{kind}: {r.status} {r.body[:200]!r}")
        if r.status >= 400 or (
            r.status == 200 and r.headers.get("Content-Type") == "application/json" and r.body
        ):
            try:
                doc = orjson.loads(r.body)  # strict: a NaN token fails here
            except orjson.JSONDecodeError:
                if not data.startswith(b"HEAD"):
                    out.append(
                        f"{kind}: {r.status} with a body that is not strict JSON: {r.body[:120]!r}"
                    )
                continue
            v2 = data.split(b"\r\n", 1)[0].split(b" ")[1:2] in ([b"/v2"], [b"/v2/"]) or (
                b" /v2/" in data.split(b"\r\n", 1)[0]
            )
            if (
                r.status >= 400
                and not (
                    isinstance(doc, dict)
                    and isinstance(doc.get("error"), dict)
                    and isinstance(doc["error"].get("type"), str)
                    and isinstance(doc["error"].get("message"), str)
                )
                and not (v2 and isinstance(doc, dict) and isinstance(doc.get("error"), str))
            ):
                out.append(
                    f"{kind}: {r.status} error body without the error shape: {r.body[:120]!r}"
                )
    return out


def _slow_client(
    port: int, head: bytes, results: list[str], lock: threading.Lock, drip_s: float
) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        got = b""
        try:
            for byte in head:
                s.sendall(bytes([byte]))
                if select.select([s], [], [], drip_s)[0]:  # the server answered: stop dripping
                    break
            while chunk := s.recv(4096):
                got += chunk
        except OSError:
            pass
    with lock:
        results.append(got.split(b"\r\n", 1)[0].decode("latin-1"))


def probe(port: int) -> bool:
    body = b'{"inputs": [1, 2, 3, 4]}'
    got, _ = _exchange(
        port, _req("POST", "/v1/predict", body, ["Content-Type: application/json"]), 10
    )
    return got.startswith(b"HTTP/1.1 200 ")


def run(
    port: int,
    cases: int,
    seen: Callable[[], set[float]],
    seed: int = 7,
    workers: int = 4,
    probe_every: int = 500,
    slow_clients: int = 8,
    slow_drip_s: float = 0.05,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Send every case; -> {"cases", "by_kind", "violations", "probes_failed", "slow", "seconds"}.

    `seen()` returns the canary values the model ran. A smuggled canary may run only when the
    server answered it as a request of its own (two answers, the first not closing the
    connection): running it behind a single answer is the desync signature."""
    started = time.monotonic()
    found: list[str] = []
    by_kind: dict[str, int] = {}
    lock = threading.Lock()
    slow: list[str] = []
    slow_threads = []
    heads = [
        b"POST /v1/predict HTTP/1.1\r\nHost: fuzz\r\nX-Slow: "
        + b"a" * 200,  # slowloris: never ends its head
        b"POST /v1/predict HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\nContent-Length: 9999\r\n\r\n{",
    ]
    for i in range(slow_clients):
        t = threading.Thread(
            target=_slow_client, args=(port, heads[i % 2], slow, lock, slow_drip_s), daemon=True
        )
        t.start()
        slow_threads.append(t)
    probes_failed = 0
    answered_apart: dict[
        float, bytes
    ] = {}  # canary -> its case, when the server answered it separately
    desyncs: dict[float, bytes] = {}

    def one(case: tuple[str, bytes]) -> None:
        kind, data = case
        try:
            got, closed = _exchange(port, data, timeout)
        except OSError as exc:
            got, closed = b"", False
            bad = [f"{kind}: connection failed: {exc}"]
        else:
            bad = violations(kind, data, got, closed)
        mark = canary_of(data) if kind == "desync" else None
        with lock:
            by_kind[kind] = by_kind.get(kind, 0) + 1
            found.extend(f"{b} <- {data[:160]!r}" for b in bad)
            if mark is not None:
                desyncs[mark] = data
                try:
                    rs = parse_responses(got)
                except Exception:
                    rs = []
                if len(rs) >= 2 and rs[0].headers.get("Connection") != "close":
                    answered_apart[mark] = data

    batch: list[tuple[str, bytes]] = []
    with ThreadPoolExecutor(workers) as pool:
        for n, case in enumerate(generate(seed, cases), 1):
            batch.append(case)
            if len(batch) == probe_every or n == cases:
                list(pool.map(one, batch))
                batch = []
                if not probe(port):
                    probes_failed += 1
    for t in slow_threads:
        t.join(60)
    for mark in sorted(seen()):
        if mark in desyncs and mark not in answered_apart:
            found.append(
                f"desync: the smuggled request {mark} ran behind one answer <- {desyncs[mark][:200]!r}"
            )
    return {
        "cases": cases,
        "by_kind": by_kind,
        "violations": found,
        "probes_failed": probes_failed,
        "slow": slow,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--slow-clients", type=int, default=64)
    args = ap.parse_args(argv)
    from torchfleet_runtime.app import Service
    from torchfleet_runtime.config import Config

    model = rt_models.Recorder()
    svc = Service(
        Config(
            port=0,
            spot_watch="off",
            input_shape=SHAPE,
            max_batch_size=4,
            log_level="error",
            header_timeout_s=2,
            body_timeout_s=2,
            max_body_mb=1,
        ),
        module=model,
    )
    svc.start()
    try:
        result = run(
            svc.port,
            args.cases,
            lambda: model.seen,
            args.seed,
            args.workers,
            slow_clients=args.slow_clients,
            slow_drip_s=0.2,
        )
    finally:
        svc.close()
    slow_ok = sum(s.startswith("HTTP/1.1 408") for s in result["slow"])
    print(
        f"{result['cases']} cases in {result['seconds']} s {result['by_kind']}; smuggled requests answered "
        f"apart: {len(model.seen)}; probes failed: {result['probes_failed']}; slow clients answered 408: {slow_ok}/"
        f"{args.slow_clients}; violations: {len(result['violations'])}"
    )
    for v in result["violations"][:50]:
        print("  " + v)
    return (
        1 if result["violations"] or result["probes_failed"] or slow_ok != args.slow_clients else 0
    )


if __name__ == "__main__":
    sys.exit(main())
