"""The Open Inference Protocol at the edge: metrics per route, and the errors the connection
layer answers before a route is chosen (malformed HTTP, 408, 431, 413) in Triton's form on a /v2
path, with the edge in the owner's process (edge_workers 0) and in edge processes (2)."""

from __future__ import annotations

import pytest
import rt_models
from prometheus_client.parser import text_string_to_metric_families
from rt_helpers import Client, in_thread, metric_value, raw_exchange, wait_until
from torchfleet_runtime.v2 import ROUTE_LABELS, V1_ROUTE, V2_ROUTE

pytestmark = pytest.mark.timeout(120)

V1 = f'route="{V1_ROUTE}"'
V2 = f'route="{V2_ROUTE}"'
# each /v2 path of the cases below and the /v1 route it stands beside
V1_TWINS = (
    (b"/v2/models/model/infer", b"/v1/predict"),
    (b"/v2/models/model ", b"/v1/model "),
    (b"/v2/health/live", b"/livez"),
    (b"/v2/health/ready", b"/readyz"),
    (b"/v2/models/", b"/v1/"),
)
INFER = (
    b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
)


@pytest.fixture(params=[0, 2], ids=["in-owner", "edge-processes"])
def svc(request, start_runtime):
    return start_runtime(
        rt_models.tiny(),
        max_body_mb=1,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        edge_workers=request.param,
    )


def _infer(client: Client, path: str = "/v2/models/model/infer", body: bytes = INFER) -> int:
    return client.call("POST", path, body, {"Content-Type": "application/json"})[0]


def _routes(text: str) -> set[str]:
    """Every value the `route` label takes in an exposition."""
    return {
        s.labels["route"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "route" in s.labels
    }


def test_v1_and_v2_predictions_land_in_their_own_series_and_the_totals_add_up(svc, client_for):
    client = client_for(svc)
    for _ in range(3):
        assert client.predict([1.0, 2.0, 3.0, 4.0])[0] == 200
    assert client.predict([1.0, 2.0])[0] == 400
    assert _infer(client) == 200
    assert _infer(client, f"/v2/models/model/versions/{svc.runtime.version}/infer") == 200
    assert _infer(client, "/v2/models/some-other-model/infer") == 404
    text = svc.runtime.metrics_text().decode()
    total = "torchfleet_requests_total"
    assert metric_value(text, total, f'code="200",{V1}') == 3
    assert metric_value(text, total, f'code="400",{V1}') == 1
    assert metric_value(text, total, f'code="200",{V2}') == 2  # the versioned path included
    assert metric_value(text, total, f'code="404",{V2}') == 1
    assert metric_value(text, total, f'code="404",{V1}') == 0
    # summed over the route the totals are what one unlabelled counter said
    assert metric_value(text, total, 'code="200"') == 5
    assert metric_value(text, total) == 7
    count = "torchfleet_request_duration_seconds_count"
    assert (metric_value(text, count, V1), metric_value(text, count, V2)) == (3, 2)
    assert metric_value(text, count) == 5
    bucket = "torchfleet_request_duration_seconds_bucket"
    assert metric_value(text, bucket, f'le="+Inf",{V2}') == 2
    # bounded: the route templates only, never a raw path or a model's name
    assert _routes(text) == set(ROUTE_LABELS)


def test_a_v2_refusal_before_the_owner_counts_under_v2(svc, client_for):
    """Refused by the edge from the headers (401 without the token is another runtime's; here a
    415 and a 413): the edge process's record carries the route to the owner."""
    client = client_for(svc)
    status = client.call("POST", "/v2/models/model/infer", INFER, {"Content-Type": "text/plain"})[0]
    assert status == 415
    assert _infer(client, body=b"{" * (2 << 20)) == 413
    text = svc.runtime.metrics_text().decode()
    total = "torchfleet_requests_total"
    assert metric_value(text, total, f'code="415",{V2}') == 1
    assert metric_value(text, total, f'code="413",{V2}') == 1
    assert metric_value(text, total, V1) == 0


@pytest.mark.parametrize(
    "raw, status, words",
    [
        (  # conflicting framing
            b"POST /v2/models/model/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
            b"Content-Length: 6\r\n\r\nhello",
            400,
            "malformed HTTP",
        ),
        (b"GET /v2/health/ready HTTP/1.1\nHost: t\n\n", 400, "malformed HTTP"),  # bare LF
        (b"GET /v2/health/ready?x=1 HTTP/1.1\r\n\r\n", 400, "Host"),
        (b"GET /v2/models/model HTTP/2.0\r\nHost: t\r\n\r\n", 400, "HTTP/2.0"),
        (
            b"GET /v2/models/model HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
            431,
            "16384",
        ),
        (
            b"GET /v2/models/model HTTP/1.1\r\nHost: t\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            "headers",
        ),
        (b"GET /v2/models/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 431, "target"),
        (  # a body on a GET route, past max_body_mb: the connection layer's own 413
            b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n",
            413,
            "5000000",
        ),
        (  # cut short
            b"POST /v2/models/model/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
            b"\r\nContent-Length: 100\r\n\r\n{",
            400,
            "ended before",
        ),
    ],
)
def test_errors_before_a_route_is_chosen_are_tritons_form_on_a_v2_path(svc, raw, status, words):
    responses, closed = raw_exchange(svc.port, raw)
    assert [r.status for r in responses] == [status] and closed, responses
    doc = responses[0].json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str) and words in doc["error"], doc
    assert responses[0].headers["Content-Type"] == "application/json"
    # the same mistake on a /v1 path keeps the /v1 form
    v1 = raw
    for v2_path, v1_path in V1_TWINS:
        v1 = v1.replace(v2_path, v1_path, 1)
    responses, _ = raw_exchange(svc.port, v1)
    assert [r.status for r in responses] == [status], responses
    assert isinstance(responses[0].json()["error"], dict)


def test_a_slow_head_on_a_v2_path_gets_tritons_408(svc):
    responses, closed = raw_exchange(
        svc.port, b"GET /v2/models/model HTTP/1.1\r\nHost: t\r\nX-Slow: ", half_close=False
    )
    assert [r.status for r in responses] == [408] and closed, responses
    assert "headers did not arrive" in responses[0].json()["error"]
    # the request line itself unfinished: the path read so far decides
    responses, _ = raw_exchange(svc.port, b"GET /v2/models/mo", half_close=False)
    assert [r.status for r in responses] == [408]
    assert isinstance(responses[0].json()["error"], str)
    responses, _ = raw_exchange(svc.port, b"GET /v1/mo", half_close=False)
    assert [r.status for r in responses] == [408]
    assert responses[0].json()["error"]["type"] == "request_timeout"


def test_a_stalled_v2_upload_gets_tritons_408_and_counts_under_v2(svc):
    head = (
        b"POST /v2/models/model/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    responses, closed = raw_exchange(svc.port, [head, b'{"inputs": '], half_close=False)
    assert [r.status for r in responses] == [408] and closed, responses
    assert "stalled" in responses[0].json()["error"]
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", f'code="408",{V2}') == 1
    assert metric_value(text, "torchfleet_requests_total", V1) == 0
    assert metric_value(text, "torchfleet_inflight_requests") == 0


def test_a_v2_request_dropped_with_its_edge_process_counts_499_under_v2(start_runtime):
    """The owner counts a request its edge process took down with it (no record will come):
    the SUBMIT frame told it the route."""
    import os
    import signal

    m = rt_models.Instrumented()
    svc = start_runtime(m, max_batch_size=1, edge_workers=1)
    (victim,) = svc.http.pids()
    body = INFER.replace(b"[1, 2, 3, 4]", f"[{rt_models.GATE_VALUE}, 0, 0, 0]".encode())
    stuck, _ = in_thread(lambda: raw_exchange(svc.port, _post(body), half_close=False, timeout=20))
    try:
        assert m.entered.wait(20)  # the request is in the model, held by the gate
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: (
                metric_value(
                    svc.runtime.metrics_text().decode(),
                    "torchfleet_requests_total",
                    f'code="499",{V2}',
                )
                == 1
            ),
            "the dropped request counted",
        )
    finally:
        m.gate.set()
        stuck.join(30)
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", V1) == 0


def _post(body: bytes, path: str = "/v2/models/model/infer") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
