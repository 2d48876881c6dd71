"""The Open Inference Protocol on a real runtime over loopback HTTP: routes, JSON and binary
tensors, Triton's error form, and the same edge as /v1 (batcher, auth, ids, metrics), with the
edge in the owner's process (edge_workers 0) and in edge processes (2)."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest
import rt_models
import torch
from rt_helpers import in_thread, metric_value, wait_until
from rt_models import GATED
from torchfleet_runtime.v2 import HEADER_LENGTH

TOKEN = "v2-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
X = [[0.5, -1.0, 2.0, 3.5], [1.0, 2.0, 3.0, 4.0]]


@pytest.fixture(params=[0, 2], ids=["in-owner", "edge-processes"])
def served(request, start_runtime, client_for):
    svc = start_runtime(rt_models.tiny(), api_token=TOKEN, edge_workers=request.param)
    return svc, client_for(svc)


def _doc(data=(1, 2, 3, 4), datatype="FP32", shape=(1, 4), name="input", size=None, **extra):
    inp = {"name": name, "datatype": datatype, "shape": list(shape)}
    if size is None:
        inp["data"] = list(data)
    else:
        inp["parameters"] = {"binary_data_size": size}
    return {"inputs": [inp], **extra}


def _infer(client, doc, binary: bytes = b"", path="/v2/models/model/infer", headers=None):
    head = json.dumps(doc).encode()
    h = {"Content-Type": "application/json", **AUTH, **(headers or {})}
    if binary:
        h[HEADER_LENGTH.title()] = str(len(head))
        h["Content-Type"] = "application/octet-stream"
    return client.call("POST", path, head + binary, h)


def _v1(client, inputs):
    status, _, doc = client.predict(inputs, **AUTH)
    assert status == 200
    return doc["outputs"]


def _split(headers, body):
    n = int(headers[HEADER_LENGTH.title()])
    return json.loads(body[:n]), body[n:]


def test_health_metadata_and_readiness(served):
    svc, client = served
    assert client.call("GET", "/v2/health/live")[0] == 200  # open, like /livez
    assert client.call("GET", "/v2/health/ready")[0] == 200
    status, _, body = client.call("GET", "/v2", headers=AUTH)
    assert status == 200 and json.loads(body)["extensions"] == ["binary_tensor_data"]
    status, _, body = client.call("GET", "/v2/models/model", headers=AUTH)
    meta = json.loads(body)
    version = svc.runtime.version
    assert status == 200 and meta["versions"] == [version]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
    assert client.call("GET", f"/v2/models/model/versions/{version}", headers=AUTH)[0] == 200
    assert client.call("GET", "/v2/models/model/ready", headers=AUTH)[0] == 200
    # another model or version: a protocol 404, never the loaded model's answer
    for path in ("/v2/models/other", "/v2/models/model/versions/9/ready", "/v2/nothing"):
        status, _, body = client.call("GET", path, headers=AUTH)
        assert status == 404 and isinstance(json.loads(body)["error"], str), path
    status, _, body = client.call("GET", "/v2/models/model")  # no token
    assert status == 401 and "api_token" in json.loads(body)["error"]


def test_json_and_binary_answers_equal_v1(served):
    _, client = served
    want = _v1(client, X)
    status, h, body = _infer(
        client,
        _doc([v for row in X for v in row], shape=(2, 4), id="r-1"),
    )
    doc = json.loads(body)
    assert status == 200 and doc["id"] == "r-1" and doc["model_name"] == "model"
    assert h["X-Model-Version"] == doc["model_version"] and "X-Request-Id" in h
    assert "queue;dur=" in h["Server-Timing"]
    (out,) = doc["outputs"]
    assert out["name"] == "output" and out["datatype"] == "FP32" and out["shape"] == [2, 3]
    assert out["data"] == [v for row in want for v in row]

    # binary in, binary out: raw little-endian float32 both ways
    raw = struct.pack("<8f", *[v for row in X for v in row])
    status, h, body = _infer(
        client,
        _doc(
            shape=(2, 4),
            size=len(raw),
            outputs=[{"name": "output", "parameters": {"binary_data": True}}],
        ),
        raw,
    )
    assert status == 200, body
    head, blob = _split(h, body)
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 24 == len(blob)
    assert list(struct.unpack("<6f", blob)) == pytest.approx([v for row in want for v in row])


def test_v2_and_v1_requests_share_one_batcher(start_runtime, client_for):
    model = rt_models.Instrumented()
    svc = start_runtime(model, max_batch_size=8, max_delay_ms=2, edge_workers=0)
    first, first_out = in_thread(lambda: client_for(svc).predict(GATED))
    assert model.entered.wait(20)  # the worker is inside the model: what comes next queues
    calls = [
        in_thread(lambda: client_for(svc).predict([1.0, 2.0, 3.0, 4.0])),
        in_thread(lambda: _infer(client_for(svc), _doc())),
        in_thread(lambda: _infer(client_for(svc), _doc((4, 3, 2, 1)))),
    ]
    wait_until(lambda: svc.runtime.batcher.queued == 3, "a /v1 and two /v2 requests queued")
    model.sizes.clear()
    model.gate.set()
    first.join(20)
    assert first_out[0][0] == 200
    for t, out in calls:
        t.join(20)
        assert out[0][0] == 200
    assert max(model.sizes) >= 3  # one batch held the /v1 and the /v2 requests together


@pytest.mark.parametrize(
    ("doc", "binary", "status", "words"),
    [
        (_doc(datatype="FP64"), b"", 400, "float64"),
        (_doc((1, 2, 3, 4, 5), shape=(1, 5)), b"", 400, "shape"),
        (_doc(shape=(2, 4)), b"", 400, "8"),
        (_doc(name="x"), b"", 400, "'input'"),
        (_doc(size=64), b"\0" * 16, 400, "binary_data_size"),
        (_doc(size=8), b"\0" * 8, 400, "needs 16"),
        (_doc(size=16), struct.pack("<4f", 1, float("nan"), 0, 0), 400, "NaN"),
        (_doc(outputs=[{"name": "nope"}]), b"", 400, "nope"),
    ],
)
def test_refusals_are_clean_4xx_and_the_server_keeps_serving(served, doc, binary, status, words):
    _, client = served
    got, _, body = _infer(client, doc, binary)
    message = json.loads(body)["error"]
    assert got == status and isinstance(message, str) and words in message, message
    assert _infer(client, _doc())[0] == 200


def test_wrong_model_version_token_and_method(served):
    svc, client = served
    doc = _doc()
    before = metric_value(
        svc.runtime.metrics_text().decode(), "torchfleet_requests_total", 'code="404"'
    )
    assert _infer(client, doc, path="/v2/models/other/infer")[0] == 404
    assert _infer(client, doc, path="/v2/models/model/versions/nope/infer")[0] == 404
    version = svc.runtime.version
    assert _infer(client, doc, path=f"/v2/models/model/versions/{version}/infer")[0] == 200
    status, h, body = client.call(
        "POST",
        "/v2/models/model/infer",
        json.dumps(doc).encode(),
        {"Content-Type": "application/json"},
    )
    assert (
        status == 401 and h["WWW-Authenticate"].startswith("Bearer") and json.loads(body)["error"]
    )
    status, h, _ = client.call("GET", "/v2/models/model/infer", headers=AUTH)
    assert status == 405 and h["Allow"] == "POST"
    after = metric_value(
        svc.runtime.metrics_text().decode(), "torchfleet_requests_total", 'code="404"'
    )
    assert after - before == 2  # counted like /v1's refusals


def test_fp16_model_binary_and_json(start_runtime, client_for):
    svc = start_runtime(rt_models.tiny().half(), dtype="float16", edge_workers=0)
    client = client_for(svc)
    x = torch.tensor([[0.5, -1.0, 2.0, 3.5]], dtype=torch.float16)
    raw = x.numpy().tobytes()
    doc = _doc(datatype="FP16", size=8, parameters={"binary_data_output": True})
    status, h, body = _infer(client, doc, raw)
    assert status == 200, body
    head, blob = _split(h, body)
    out = head["outputs"][0]
    want = _v1(client, x.float().tolist())
    got = torch.frombuffer(
        bytearray(blob),
        dtype=getattr(torch, {"FP32": "float32", "FP16": "float16"}[out["datatype"]]),
    )
    assert got.float().tolist() == pytest.approx(want[0], rel=1e-2)
    status, _, body = _infer(
        client,
        _doc(x.float().tolist()[0], datatype="FP16"),
    )
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == pytest.approx(
        want[0], rel=1e-2
    )
    # FP32 bytes to an FP16 model: the /v1 dtype refusal
    status, _, body = _infer(
        client,
        _doc(size=16),
        b"\0" * 16,
    )
    assert status == 400 and "float16" in json.loads(body)["error"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bench_load_drives_v2_and_reads_the_server_cpu(start_runtime, tmp_path, binary):
    from torchfleet_bench.load import main as load

    svc = start_runtime(rt_models.tiny(), edge_workers=2)
    out = tmp_path / "load.json"
    argv = [f"http://127.0.0.1:{svc.port}", "--protocol", "v2", "--concurrency", "2"]
    argv += ["--requests", "40", "--batch", "3", "--server-pid", str(os.getpid())]
    assert load(argv + ["--json", str(out)] + (["--binary"] if binary else [])) == 0
    report = json.loads(out.read_text())
    (level,) = report["levels"]
    assert report["config"]["route"] == "/v2/models/model/infer"
    assert level["ok"] == level["requests"] == 40 and level["errors"] == {}
    assert level["server_cpu_us_per_request"] > 0  # this process and its edge processes


def test_a_drain_serves_an_admitted_v2_request_and_refuses_new_ones(start_runtime, client_for):
    m = rt_models.Instrumented()
    svc = start_runtime(m, max_batch_size=1, drain_timeout_s=30, edge_workers=0)
    rt = svc.runtime
    gated = _doc([rt_models.GATE_VALUE, 0, 0, 0])
    stuck, stuck_out = in_thread(lambda: _infer(client_for(svc), gated))
    assert m.entered.wait(20)
    rt.request_stop("test")
    svc.http.begin_closing()
    status, h, body = _infer(client_for(svc), _doc())
    assert status == 503 and h["Connection"] == "close" and "Retry-After" in h
    assert "draining" in json.loads(body)["error"]
    wait_until(lambda: client_for(svc).call("GET", "/v2/health/ready")[0] == 503, "not ready")
    drained: list[bool] = []
    waiter, _ = in_thread(lambda: drained.append(rt.drain(30)))
    time.sleep(0.2)
    assert not drained  # the admitted /v2 request is still running: the drain waits for it
    m.gate.set()
    waiter.join(10)
    stuck.join(10)
    assert drained == [True] and stuck_out[0][0] == 200


def test_the_body_limit_and_media_type_on_v2(start_runtime, client_for):
    svc = start_runtime(rt_models.tiny(), max_body_mb=0.01)  # 10,485 bytes
    client = client_for(svc)
    big = _doc([0.5] * 4000, shape=(1000, 4))
    status, h, body = _infer(client, big)
    assert status == 413 and "max_body_mb" in json.loads(body)["error"] and "X-Request-Id" in h
    status, _, body = _infer(client, _doc(), headers={"Content-Type": "text/plain"})
    assert status == 415 and isinstance(json.loads(body)["error"], str)
    assert _infer(client, _doc())[0] == 200
