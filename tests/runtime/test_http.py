"""The HTTP API over real loopback HTTP: answers, binary bodies, and every client mistake as a
JSON 4xx after which the same connection keeps serving."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import rt_models
import torch
from rt_helpers import metric_value

# A hang (a batch that never closes, a drain that never ends) fails fast instead of at 10 min.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(start_runtime, client_for):
    rt = start_runtime(rt_models.tiny(), max_batch_size=4, max_body_mb=0.01)
    return rt, client_for(rt)


def test_one_instance_and_a_batch_give_the_models_answers(served):
    _, c = served
    x = torch.tensor([[0.5, -1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    status, _, doc = c.predict(x[0].tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x[:1])[0])
    status, _, doc = c.predict(x.tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x))


def test_a_request_larger_than_the_cap_is_split_not_refused(served):
    rt, c = served
    x = torch.randn(11, 4)  # cap is 4: three chunks
    status, _, doc = c.predict(x.tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x), atol=1e-6)
    assert rt.runtime.batcher.cap == 4


def test_raw_and_npy_bodies_and_binary_answers(served):
    _, c = served
    x = torch.randn(3, 4)
    status, _, data = c.call(
        "POST",
        "/v1/predict",
        x.numpy().tobytes(),
        {"Content-Type": "application/octet-stream", "X-Shape": "3,4", "X-Dtype": "float32"},
    )
    assert status == 200
    assert torch.allclose(
        torch.tensor(json.loads(data)["outputs"]), rt_models.expected(x), atol=1e-6
    )

    buf = io.BytesIO()
    np.save(buf, x.numpy())
    status, headers, data = c.call(
        "POST",
        "/v1/predict",
        buf.getvalue(),
        {"Content-Type": "application/x-npy", "Accept": "application/octet-stream"},
    )
    assert status == 200
    assert headers["X-Shape"] == "3,3" and headers["X-Dtype"] == "float32"
    got = torch.tensor(struct.unpack("<9f", data)).reshape(3, 3)
    assert torch.allclose(got, rt_models.expected(x), atol=1e-6)


BAD = [
    # (body, headers, status, error type)
    (b'{"inputs": [1, 2', {"Content-Type": "application/json"}, 400, "malformed_json"),
    (b'{"data": [1, 2, 3, 4]}', {"Content-Type": "application/json"}, 400, "malformed_json"),
    (b'{"inputs": [1, 2, 3]}', {"Content-Type": "application/json"}, 400, "wrong_shape"),
    (
        b'{"inputs": [[1, 2, 3, 4], [1, 2]]}',
        {"Content-Type": "application/json"},
        400,
        "wrong_shape",
    ),
    (b'{"inputs": ["a", "b", "c", "d"]}', {"Content-Type": "application/json"}, 400, "wrong_dtype"),
    (b'{"inputs": []}', {"Content-Type": "application/json"}, 400, "empty_input"),
    (b"", {"Content-Type": "application/json"}, 400, "empty_input"),
    (b"1,2,3,4", {"Content-Type": "text/csv"}, 415, "unsupported_media_type"),
    (
        b"\0" * 16,
        {"Content-Type": "application/octet-stream", "X-Shape": "4", "X-Dtype": "float64"},
        400,
        "wrong_dtype",
    ),
    (
        b"\0" * 12,
        {"Content-Type": "application/octet-stream", "X-Shape": "4", "X-Dtype": "float32"},
        400,
        "wrong_shape",
    ),
    (
        b"\0" * 16,
        {"Content-Type": "application/octet-stream", "X-Dtype": "float32"},
        400,
        "missing_header",
    ),
    (b"not npy", {"Content-Type": "application/x-npy"}, 400, "malformed_npy"),
    (b"x" * 20000, {"Content-Type": "application/json"}, 413, "payload_too_large"),
]


@pytest.mark.parametrize(
    "body, headers, status, type_", BAD, ids=[b[3] + "-" + str(i) for i, b in enumerate(BAD)]
)
def test_bad_input_is_a_json_4xx_and_the_server_keeps_serving(served, body, headers, status, type_):
    rt, c = served
    got, resp_headers, data = c.call("POST", "/v1/predict", body, headers)
    assert got == status, data
    assert resp_headers["Content-Type"] == "application/json"
    err = json.loads(data)["error"]
    assert err["type"] == type_ and err["message"]
    ok, _, doc = c.predict([1.0, 2.0, 3.0, 4.0])  # same client, reconnecting if the server closed
    assert ok == 200 and len(doc["outputs"]) == 3
    assert (
        metric_value(
            rt.runtime.metrics_text().decode(), "torchfleet_requests_total", f'code="{status}"'
        )
        >= 1
    )


def test_unknown_path_and_wrong_method(served):
    _, c = served
    status, _, data = c.call("GET", "/v3/nothing")  # /v2/* is the Open Inference Protocol
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found"
    status, headers, data = c.call("GET", "/v1/predict")
    assert status == 405 and headers["Allow"] == "POST"
    status, headers, data = c.call("DELETE", "/readyz", b"{}", {"Content-Type": "application/json"})
    assert status == 405 and json.loads(data)["error"]["type"] == "method_not_allowed"
    assert c.predict([0.0, 0.0, 0.0, 0.0])[0] == 200


def test_model_health_and_metrics_endpoints(served):
    rt, c = served
    status, info = c.get_json("/v1/model")
    assert status == 200
    assert info["input_shape"] == [4] and info["dtype"] == "float32" and info["device"] == "cpu"
    assert info["max_batch_size"] == 4 and info["warmed_batch_sizes"] == [1, 2, 4]
    assert c.get_json("/livez") == (200, {"status": "alive"})
    assert c.get_json("/readyz") == (200, {"status": "ready"})
    assert c.predict([1.0, 1.0, 1.0, 1.0])[0] == 200
    status, headers, text = c.call("GET", "/metrics")
    text = text.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert metric_value(text, "torchfleet_ready") == 1
    assert metric_value(text, "torchfleet_requests_total", 'code="200"') == 1
    assert metric_value(text, "torchfleet_request_duration_seconds_count") == 1
    assert metric_value(text, "torchfleet_last_request_timestamp_seconds") > 0
    assert metric_value(text, "torchfleet_warmup_seconds") > 0
    assert "torchfleet_model_load_seconds" in text and "torchfleet_inflight_requests" in text


class NaNModel(rt_models.Tiny):
    def forward(self, x):
        y = super().forward(x)
        y[:, 1] = float("nan")
        y[:, 2] = float("inf")
        return y


def test_non_finite_inputs_are_refused_unless_allowed(start_runtime, client_for):
    nan = struct.pack("<4f", float("nan"), 1, 2, 3)
    raw = {"Content-Type": "application/octet-stream", "X-Shape": "4", "X-Dtype": "float32"}
    strict = client_for(start_runtime(rt_models.tiny(), max_batch_size=2))
    status, _, data = strict.call("POST", "/v1/predict", nan, raw)
    assert status == 400 and json.loads(data)["error"]["type"] == "non_finite_input"
    status, _, data = strict.call(
        "POST", "/v1/predict", b'{"inputs": [NaN, 1, 2, 3]}', {"Content-Type": "application/json"}
    )
    assert (
        status == 400 and json.loads(data)["error"]["type"] == "malformed_json"
    )  # JSON has no NaN
    lenient = client_for(
        start_runtime(
            rt_models.tiny(),
            max_batch_size=2,
            allow_non_finite_inputs=True,
            non_finite_outputs="null",
        )
    )
    status, _, data = lenient.call("POST", "/v1/predict", nan, raw)
    assert (
        status == 200 and json.loads(data)["outputs"][0] is None
    )  # NaN in, NaN out, written as null


def test_non_finite_outputs_are_an_error_by_default_or_null_never_a_bare_nan(
    start_runtime, client_for
):
    c = client_for(start_runtime(NaNModel(), max_batch_size=2))
    status, _, data = c.call(
        "POST", "/v1/predict", b'{"inputs": [1, 2, 3, 4]}', {"Content-Type": "application/json"}
    )
    assert status == 500 and json.loads(data)["error"]["type"] == "non_finite_output"
    status, headers, data = c.call(
        "POST",
        "/v1/predict",
        b'{"inputs": [1, 2, 3, 4]}',
        {"Content-Type": "application/json", "Accept": "application/octet-stream"},
    )
    got = struct.unpack("<3f", data)  # binary answers carry IEEE values as they are
    assert status == 200 and got[1] != got[1] and got[2] == float("inf")
    c = client_for(start_runtime(NaNModel(), max_batch_size=2, non_finite_outputs="null"))
    status, _, data = c.call(
        "POST", "/v1/predict", b'{"inputs": [1, 2, 3, 4]}', {"Content-Type": "application/json"}
    )
    assert status == 200 and b"NaN" not in data and b"Infinity" not in data
    assert json.loads(data)["outputs"][1:] == [None, None]
