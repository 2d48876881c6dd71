"""The HTTP edge over raw sockets: framing per RFC 9112 section 6, timeouts, the connection cap,
lingering close, early answers, pipelining, 100-continue, auth, request ids and the headers
every prediction answer carries. Each test names the property it holds."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import rt_models
import torch
from rt_helpers import EDGE_WORKERS, Client, metric_value, raw_exchange, wait_until

pytestmark = pytest.mark.timeout(120)

CANARY = rt_models.CANARY


def predict_bytes(
    body: bytes = b'{"inputs": [1, 2, 3, 4]}', extra: str = "", ctype: str = "application/json"
) -> bytes:
    return (
        f"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}\r\n"
    ).encode() + body


SMUGGLED = predict_bytes(f'{{"inputs": [{CANARY}, 0, 0, 0]}}'.encode())


@pytest.fixture
def edge(start_runtime):
    m = rt_models.Recorder()
    svc = start_runtime(
        m,
        max_batch_size=4,
        max_body_mb=1,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        keepalive_timeout_s=5,
        max_connections=40,
    )
    m.instances = 0  # warm-up ran it too
    return svc, m


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 5\r\nContent-Length: 5",  # duplicate, even when equal
        "Content-Length: 5\r\nContent-Length: 80",  # conflicting
        "Content-Length: 5\r\nTransfer-Encoding: chunked",  # both (CL.TE / TE.CL desync)
        "Transfer-Encoding: chunked\r\nContent-Length: 5",
        "Content-Length: +5",  # not a run of digits
        "Content-Length: 5x",
        "Content-Length: -5",
        "Content-Length: 0x10",
        " Content-Length: 5",  # obs-fold / leading whitespace
        "Content-Length : 5",  # whitespace before the colon
        "Content-Length: 99999999999999999999999",
    ],
)
def test_conflicting_or_malformed_framing_is_400_close_and_never_executes_the_smuggled_request(
    edge, framing
):
    svc, m = edge
    head = f"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    responses, closed = raw_exchange(svc.port, head.encode() + b"0\r\n\r\n" + SMUGGLED)
    assert [r.status for r in responses] == [400], responses
    assert responses[0].json()["error"]["type"] == "bad_request"
    assert responses[0].headers["Connection"] == "close" and closed
    assert not m.canary
    assert Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])[0] == 200  # the server keeps serving


@pytest.mark.parametrize("te", ["chunked", "gzip, chunked", "identity"])
def test_transfer_encoding_is_411_and_close(edge, te):
    svc, m = edge
    body = b'5\r\n{"inp\r\n0\r\n\r\n'
    head = f"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: {te}\r\n\r\n"
    responses, closed = raw_exchange(svc.port, head.encode() + body + SMUGGLED)
    assert responses and responses[0].status in (400, 411) and closed, responses
    assert responses[0].json()["error"]["type"] in ("length_required", "bad_request")
    assert len(responses) == 1 and not m.canary


@pytest.mark.parametrize(
    "raw, status, type_",
    [
        (b"FOO /v1/predict HTTP/1.1\r\nHost: t\r\n\r\n", 405, "method_not_allowed"),
        (b"GET /v1/predict HTTP/1.1\r\nHost: t\r\n\r\n", 405, "method_not_allowed"),
        (b"GET /livez HTTP/2.0\r\nHost: t\r\n\r\n", 400, "unsupported_http_version"),
        (b"GET /livez HTTP/1.1\r\n\r\n", 400, "bad_request"),  # no Host
        (b"GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "bad_request"),
        (b"GET /livez HTTP/1.1\nHost: t\n\n", 400, "bad_request"),  # bare LF
        (b"GET /li\x00vez HTTP/1.1\r\nHost: t\r\n\r\n", 400, "bad_request"),
        (
            b"GET /livez HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
            431,
            "headers_too_large",
        ),
        (
            b"GET /livez HTTP/1.1\r\nHost: t\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            "headers_too_large",
        ),
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 431, "headers_too_large"),
        (
            b'POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"in',
            400,
            "bad_request",
        ),  # cut short
    ],
)
def test_protocol_mistakes_are_json_4xx_with_a_status_line(edge, raw, status, type_):
    svc, _ = edge
    responses, closed = raw_exchange(svc.port, raw)
    assert [r.status for r in responses] == [status], responses
    r = responses[0]
    assert r.headers["Content-Type"] == "application/json" and r.json()["error"]["type"] == type_
    if status == 405:
        assert "POST" in r.headers["Allow"]


def test_slowloris_headers_get_408_and_cost_no_thread(edge):
    svc, _ = edge
    threads_before = threading.active_count()
    socks = []
    for _ in range(30):  # more stalled clients than the old server had threads to spare
        s = socket.create_connection(("127.0.0.1", svc.port))
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        socks.append(s)
    assert Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])[0] == 200  # served meanwhile, at once
    assert threading.active_count() == threads_before  # no thread per connection
    for s in socks:
        s.settimeout(5)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 408 Request Timeout") and b'"request_timeout"' in data, (
            data
        )
        s.close()


def test_a_stalled_upload_gets_408_and_counts_as_the_predictions_answer(edge):
    svc, _ = edge
    head = b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    responses, closed = raw_exchange(svc.port, [head, b'{"inputs": '], half_close=False, timeout=5)
    assert [r.status for r in responses] == [408] and closed
    assert "stalled" in responses[0].json()["error"]["message"]
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", 'code="408"') == 1
    assert metric_value(text, "torchfleet_inflight_requests") == 0


def test_bytes_not_arrived_are_not_allocated(edge):
    svc, _ = edge
    # 30 uploads each announcing the 1 MiB limit and sending 10 bytes: an allocate-up-front server
    # holds 30 MiB here; this one holds what arrived
    import resource

    # the bodies are held where HTTP is served: this process, and its edge processes if any
    pids = [os.getpid(), *(svc.http.pids() if hasattr(svc.http, "pids") else [])]

    def rss_mib() -> float:
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1])
        return total * resource.getpagesize() / 2**20

    before = rss_mib()
    socks = []
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", svc.port))
        s.sendall(
            b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: 1048576\r\n\r\n0123456789"
        )
        socks.append(s)
    wait_until(
        lambda: (
            metric_value(svc.runtime.metrics_text().decode(), "torchfleet_inflight_requests") == 30
        ),
        "30 uploads in progress",
    )
    assert rss_mib() - before < 10
    for s in socks:
        s.close()


def test_connection_cap_answers_503_and_closes(start_runtime):
    # max_connections holds per edge process and the kernel picks which edge accepts a
    # connection: with one edge the 41st is the one refused
    svc = start_runtime(rt_models.Recorder(), max_connections=40, edge_workers=min(1, EDGE_WORKERS))
    held = [socket.create_connection(("127.0.0.1", svc.port)) for _ in range(40)]
    wait_until(
        lambda: (
            metric_value(svc.runtime.metrics_text().decode(), "torchfleet_open_connections") == 40
        ),
        "40 open connections",
    )
    responses, closed = raw_exchange(svc.port, b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
    assert [r.status for r in responses] == [503] and closed
    assert (
        responses[0].json()["error"]["type"] == "too_many_connections"
        and responses[0].headers["Retry-After"]
    )
    for s in held:
        s.close()
    wait_until(
        lambda: (
            raw_exchange(svc.port, b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")[0][0].status == 200
        ),
        "room again",
    )


def test_an_oversized_body_gets_a_readable_413_by_lingering_close(edge):
    svc, m = edge
    body = b"x" * (
        3 * 2**20
    )  # 3 MiB against a 1 MiB limit, sent in full: the client reads its 413, no reset
    responses, closed = raw_exchange(svc.port, predict_bytes(body))
    assert [r.status for r in responses] == [413] and closed
    assert responses[0].json()["error"]["type"] == "payload_too_large"
    assert responses[0].headers["Connection"] == "close" and m.instances == 0


def test_early_answers_skip_a_small_body_and_keep_the_connection(edge):
    svc, _ = edge
    wrong = b"POST /v2/nothing HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
    odd = b"PUT /v1/model HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
    responses, _ = raw_exchange(svc.port, wrong + odd + predict_bytes())
    assert [r.status for r in responses] == [404, 405, 200]
    assert responses[1].headers["Allow"] == "GET, HEAD"
    assert len(responses[2].json()["outputs"]) == 3


def test_pipelined_requests_are_answered_in_order(edge):
    svc, _ = edge
    reqs = [
        predict_bytes(f'{{"inputs": [{i}, 0, 0, 0]}}'.encode(), f"X-Request-Id: r{i}\r\n")
        for i in range(6)
    ]
    responses, _ = raw_exchange(
        svc.port, b"".join(reqs) + b"GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    assert [r.status for r in responses] == [200] * 6 + [200]
    assert [r.headers["X-Request-Id"] for r in responses[:6]] == [f"r{i}" for i in range(6)]
    for i, r in enumerate(responses[:6]):
        want = rt_models.expected(torch.tensor([[float(i), 0, 0, 0]]))[0]
        assert torch.allclose(torch.tensor(r.json()["outputs"]), want)


def test_expect_100_continue_only_for_an_acceptable_request(edge):
    svc, _ = edge
    body = b'{"inputs": [1, 2, 3, 4]}'
    head = (
        b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", svc.port), timeout=5) as s:
        s.sendall(head)
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
    too_big = head.replace(b"%d" % len(body), b"5000000")
    responses, _ = raw_exchange(svc.port, too_big)
    assert [r.status for r in responses] == [413]  # no 100: the client need not send the body


def test_idle_keepalive_connections_close_after_the_timeout(start_runtime):
    svc = start_runtime(rt_models.tiny(), max_batch_size=2, keepalive_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", svc.port), timeout=5) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
        t0 = time.monotonic()
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and 0.25 < time.monotonic() - t0 < 3


def test_prediction_answers_carry_request_id_model_version_and_server_timing(edge):
    svc, _ = edge
    c = Client(svc.port)
    status, headers, _ = c.predict([1.0, 2.0, 3.0, 4.0], **{"X-Request-Id": "client-id.42"})
    assert status == 200 and headers["X-Request-Id"] == "client-id.42"
    assert headers["X-Model-Version"] == svc.runtime.version == "module"
    stages = dict(part.strip().split(";dur=") for part in headers["Server-Timing"].split(","))
    assert set(stages) == {"decode", "queue", "model", "encode"} and all(
        float(v) >= 0 for v in stages.values()
    )
    status, headers, _ = c.predict([1.0, 2.0, 3.0, 4.0], **{"X-Request-Id": "bad id\u00e9" * 30})
    assert (
        status == 200 and len(headers["X-Request-Id"]) == 16 and headers["X-Request-Id"] != "bad id"
    )
    status, headers, _ = c.predict([1.0, 2.0])  # errors carry the ids too
    assert status == 400 and headers["X-Request-Id"] and headers["X-Model-Version"] == "module"
    text = svc.runtime.metrics_text().decode()
    for stage in ("decode", "queue", "model", "encode", "write"):
        assert metric_value(text, "torchfleet_stage_duration_seconds_count", on_cpu(stage)) == 2
    labels = (
        'device="cpu",format="module",model_name="model",model_version="module",precision="fp32"'
    )
    assert "torchfleet_model_info{" + labels + "} 1.0" in text


def on_cpu(stage: str) -> str:
    """The labels of one stage's series on the (one, unpinned) CPU replica."""
    return f'device="cpu",stage="{stage}"'


def test_stage_timing_off_drops_the_header_and_the_stage_histograms(start_runtime):
    svc = start_runtime(rt_models.tiny(), max_batch_size=2, stage_timing=False)
    status, headers, _ = Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200 and "Server-Timing" not in headers
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_stage_duration_seconds_count", on_cpu("decode")) == 0
    assert (
        metric_value(text, "torchfleet_stage_duration_seconds_count", on_cpu("model")) == 1
    )  # the batcher's own


TOKEN = "s3cret-token-0123456789"
ADMIN = "admin-token-abcdefghijkl"


def test_bearer_tokens_guard_v1_and_admin_but_not_health(start_runtime):
    svc = start_runtime(rt_models.tiny(), max_batch_size=2, api_token=TOKEN, admin_token=ADMIN)
    c = Client(svc.port)
    status, headers, doc = c.predict([1.0, 2.0, 3.0, 4.0])
    assert (
        status == 401
        and doc["error"]["type"] == "unauthorized"
        and headers["WWW-Authenticate"].startswith("Bearer")
    )
    assert c.predict([1.0, 2.0, 3.0, 4.0], Authorization="Bearer wrong-token-0123456789")[0] == 401
    assert c.predict([1.0, 2.0, 3.0, 4.0], Authorization=f"Bearer {TOKEN}")[0] == 200
    assert c.call("GET", "/v1/model")[0] == 401
    assert c.call("GET", "/v1/model", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert c.call("GET", "/readyz")[0] == 200 and c.call("GET", "/metrics")[0] == 200
    assert c.call("POST", "/admin/reload", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 401
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", 'code="401"') == 2


def test_the_admin_api_is_off_without_a_token(edge):
    svc, _ = edge
    status, _, data = Client(svc.port).call("POST", "/admin/reload")
    assert status == 403 and b"admin_token" in data


def test_a_handler_that_raises_is_a_json_500_and_the_server_keeps_serving(edge, monkeypatch):
    """A bug behind the edge (here: the model card and a prediction's submit raising) is a 500
    with a JSON body and Connection: close, the in-flight prediction is released (a drain does
    not wait for it), and the next request is served; before, the connection hung unanswered."""
    from torchfleet_runtime import service

    svc, _ = edge
    rt = svc.runtime
    real_status = rt.status

    def broken_card(detail: bool = False):
        if detail:
            raise TypeError("the card cannot be built")
        return real_status(detail)

    monkeypatch.setattr(rt, "status", broken_card)
    (resp,), closed = raw_exchange(svc.port, b"GET /v1/model HTTP/1.1\r\nHost: t\r\n\r\n", 5)
    assert resp.status == 500 and closed
    assert resp.json()["error"]["type"] == "internal_error"
    assert "TypeError" in resp.json()["error"]["message"]

    def broken_submit(self, *args, **kwargs):
        raise KeyError("decode bug")

    # the owner's half of submitting: from a body here, or from an edge process's decoded bytes
    monkeypatch.setattr(service.PredictCall, "submit", broken_submit)
    monkeypatch.setattr(service.PredictCall, "submit_tensor", broken_submit)
    (resp,), closed = raw_exchange(svc.port, predict_bytes(), 5)
    assert resp.status == 500 and closed and resp.json()["error"]["type"] == "internal_error"
    text = rt.metrics_text().decode()
    assert metric_value(text, "torchfleet_inflight_requests") == 0
    assert metric_value(text, "torchfleet_requests_total", 'code="500"') == 1
    assert rt._admitted == 0

    monkeypatch.undo()
    status, _, doc = Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200 and len(doc["outputs"]) == 3


def test_an_answer_that_fails_to_encode_is_a_json_500_and_counted(edge, monkeypatch):
    """The model ran but building its answer raised (a bug, not the client's or the model's
    fault): 500 internal_error with Connection: close, the prediction counted and released, the
    next one served. Before, the answer's future never resolved and the client waited forever."""
    from torchfleet_runtime import service

    svc, _ = edge

    def broken_answer(self, *args):
        raise ValueError("encoder bug")

    # building the answer: here, or the outputs an edge process encodes
    monkeypatch.setattr(service.PredictCall, "answer", broken_answer)
    monkeypatch.setattr(service.PredictCall, "outputs", broken_answer)
    (resp,), closed = raw_exchange(svc.port, predict_bytes(), 10)
    assert resp.status == 500 and closed
    error = resp.json()["error"]
    assert error["type"] == "internal_error" and "ValueError: encoder bug" in error["message"]
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_inflight_requests") == 0
    assert metric_value(text, "torchfleet_requests_total", 'code="500"') == 1
    monkeypatch.undo()
    assert Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])[0] == 200
