"""Start-up, drain and reload: a real `torchfleet-runtime serve` process receives SIGTERM with
requests in flight (a Python-gated model and a real TorchScript one), SIGHUP, and bad model paths.
Spot notices: test_spot.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import rt_models
import torch
from rt_helpers import CLI, Client, ServeProcess, in_thread, metric_value, wait_until
from torchfleet_runtime import demo, model

# A hang (a batch that never closes, a drain that never ends) fails fast instead of at 10 min.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gated_server(tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(rt_models.file_gated().state_dict(), weights)
    gate = tmp_path / "gate"
    started: list[ServeProcess] = []

    def start(*extra: str) -> ServeProcess:
        env = {"PYTHONPATH": str(Path(rt_models.__file__).parent), "RT_GATE_FILE": str(gate)}
        p = ServeProcess(
            [
                "--model",
                str(weights),
                "--factory",
                "rt_models:file_gated",
                "--input-shape",
                "4",
                "--max-batch-size",
                "1",
                "--log-level",
                "info",
                *extra,
            ],
            env,
        )
        started.append(p)
        c = Client(p.port)
        wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "the server to be ready", 60)
        return p

    yield start, gate
    for p in started:
        p.kill()


def test_sigterm_drains_in_flight_requests_and_exits_0(gated_server):
    start, gate = gated_server
    p = start("--drain-timeout-s", "60")
    c = Client(p.port)
    xs = [torch.tensor([rt_models.GATE_VALUE, float(i), 1.0, 2.0]) for i in range(4)]
    workers = [in_thread(lambda x=x: Client(p.port).predict(x.tolist())) for x in xs]
    wait_until(
        lambda: (
            metric_value(c.call("GET", "/metrics")[2].decode(), "torchfleet_inflight_requests") == 4
        ),
        "4 requests in flight",
    )
    p.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: c.call("GET", "/readyz")[0] == 503, "/readyz to turn 503")
    status, headers, doc = c.predict([1.0, 2.0, 3.0, 4.0])
    assert status == 503 and doc["error"]["type"] == "not_ready" and headers["Retry-After"]
    gate.touch()  # let the model finish: every in-flight request must still be answered
    for (t, out), x in zip(workers, xs, strict=True):
        t.join(30)
        status, _, doc = out[0]
        assert status == 200
        assert torch.allclose(
            torch.tensor(doc["outputs"]), rt_models.expected(x[None])[0], atol=1e-5
        )
    assert p.wait(30) == 0
    assert any("draining: SIGTERM" in line for line in p.log)


def test_drain_gives_up_after_the_timeout_and_still_exits_0(gated_server):
    start, _ = gated_server
    p = start("--drain-timeout-s", "0.5")
    c = Client(p.port)
    t, out = in_thread(lambda: Client(p.port).predict([rt_models.GATE_VALUE, 0.0, 0.0, 0.0]))
    wait_until(
        lambda: (
            metric_value(c.call("GET", "/metrics")[2].decode(), "torchfleet_inflight_requests") == 1
        ),
        "a stuck request",
    )
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0  # the gate never opens: the drain timeout ends it
    t.join(10)
    status, headers, doc = out[0]  # cut off with an answer it can act on, not a reset
    assert (
        status == 503 and doc["error"]["type"] == "not_ready" and "drain" in doc["error"]["message"]
    )
    assert headers["Connection"] == "close" and headers["Retry-After"]
    assert any("drain timeout: 1 request(s) still in flight" in line for line in p.log)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    """The real TorchScript demo model, written once (the serve processes only read it)."""
    model_path, _ = demo.write_demo_model(tmp_path_factory.mktemp("demo"))
    return str(model_path)


def _no_abort(p: ServeProcess) -> None:
    text = "".join(p.log)
    assert "terminate called" not in text and "Traceback" not in text, text[-3000:]


def test_a_torchscript_batch_running_past_the_drain_timeout_exits_0(demo_model):
    """The batcher is inside TorchScript when the drain gives up: interpreter shutdown would stop
    that thread inside torch's C++ frames and abort (exit 134); the process must exit 0."""
    p = ServeProcess(
        [
            "--model",
            demo_model,
            "--max-batch-size",
            "4",
            "--max-queue",
            "1024",
            "--torch-threads",
            "1",
            "--drain-timeout-s",
            "0.3",
            "--log-level",
            "info",
            "--log-format",
            "text",
        ],
        {},
    )
    try:
        c = Client(p.port)
        wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "the server to be ready", 60)
        n = 512  # 128 batches of 4: seconds of model work, far past the drain timeout
        body = bytes(n * 3 * 64 * 64 * 4)
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Shape": f"{n},3,64,64",
            "X-Dtype": "float32",
        }
        t, out = in_thread(lambda: Client(p.port).call("POST", "/v1/predict", body, headers))

        def batches_run() -> float:
            return metric_value(
                c.call("GET", "/metrics")[2].decode(), "torchfleet_batch_size_count", 'device="cpu"'
            )

        wait_until(lambda: batches_run() >= 2, "the batcher to be busy with the big request", 60)
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        t.join(10)
        status, answer_headers, data = out[0]
        assert status == 503 and json.loads(data)["error"]["type"] == "not_ready"
        assert answer_headers["Connection"] == "close"
    finally:
        p.kill()
    _no_abort(p)
    assert any("1 request(s) were cut off with 503" in line for line in p.log)


def test_sigterm_during_a_torchscript_warm_up_exits_0_at_once(demo_model):
    p = ServeProcess(
        [
            "--model",
            demo_model,
            "--max-batch-size",
            "8",
            "--warmup-iterations",
            "500",
            "--torch-threads",
            "1",
            "--log-level",
            "info",
            "--log-format",
            "text",
        ],
        {},
    )
    try:
        wait_until(
            lambda: any("loaded torchscript model" in line for line in p.log),
            "the model to load",
            60,
        )
        time.sleep(0.2)  # inside the warm-up runs now (500 per bucket: many seconds)
        assert Client(p.port).call("GET", "/readyz")[0] == 503
        started = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        assert time.monotonic() - started < 5
    finally:
        p.kill()
    _no_abort(p)


def test_a_model_that_was_never_mounted_fails_start_up_naming_the_path_and_the_way_out(tmp_path):
    """The container's default config reads /models/model.pt; without the mount the sidecar is
    missing too, and the error must be about the model file (not the input shape), one line, no
    traceback, exit 1."""
    models = tmp_path / "models"
    models.mkdir()
    config = tmp_path / "runtime.yml"
    config.write_text(f"model: {models / 'model.pt'}\n")
    proc = subprocess.run(
        [
            CLI,
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--spot-watch",
            "off",
            "--log-format",
            "text",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "container": "podman"},
    )
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "input shape is unknown" not in err, err
    assert f"config key 'model': model file not found: {models / 'model.pt'}" in err
    assert f"{models} holds no model file" in err and "TORCHFLEET_MODEL" in err
    assert f"mount the model's directory at {models}" in err and f"-v DIR:{models}:ro" in err


def test_a_bad_model_path_is_explained_by_what_is_there(tmp_path, monkeypatch):
    monkeypatch.delenv("container", raising=False)
    monkeypatch.setattr(model, "_in_container", lambda: False)
    models = tmp_path / "models"
    models.mkdir()
    (models / "resnet50.onnx").write_bytes(b"x")  # mounted, but the file has another name

    def error(path: Path) -> str:
        with pytest.raises(model.ModelError) as info:
            model.check_model_file(str(path))
        return str(info.value)

    err = error(models / "model.pt")
    assert (
        f"{models} holds resnet50.onnx" in err
        and f"TORCHFLEET_MODEL={models / 'resnet50.onnx'}" in err
    )
    assert "mount" not in err  # not in a container: no podman advice
    assert f"{tmp_path / 'nowhere'} does not exist" in error(tmp_path / "nowhere" / "model.pt")
    err = error(models)
    assert f"config key 'model': {models} is a directory" in err and "resnet50.onnx" in err
    model.check_model_file(str(models / "resnet50.onnx"))  # a readable file passes


def test_sighup_reloads_the_model_in_the_same_process(tmp_path):
    path = tmp_path / "model.pt"
    torch.jit.script(rt_models.tiny()).save(str(path))
    meta = {"input_shape": [4], "name": "tiny", "version": "2026-12-01.1"}
    path.with_suffix(".json").write_text(json.dumps(meta))
    p = ServeProcess(
        [
            "--model",
            str(path),
            "--max-batch-size",
            "2",
            "--log-level",
            "info",
            "--log-format",
            "json",
        ],
        {},
    )
    try:
        c = Client(p.port)
        wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "the server to be ready", 60)
        assert c.predict([1.0, 2.0, 3.0, 4.0])[1]["X-Model-Version"] == "2026-12-01.1"
        path.with_suffix(".json").write_text(json.dumps({**meta, "version": "2026-12-01.2"}))
        p.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: c.get_json("/v1/model")[1]["model_version"] == "2026-12-01.2",
            "the new version",
            60,
        )
        assert (
            c.call("GET", "/readyz")[0] == 200 and p.proc.poll() is None
        )  # the same process, still ready
        status, headers, _ = c.predict([1.0, 2.0, 3.0, 4.0])
        assert status == 200 and headers["X-Model-Version"] == "2026-12-01.2"
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        p.kill()
    lines = [json.loads(line) for line in p.log if line.startswith("{")]
    done = [r for r in lines if r["msg"].startswith("reload done")]
    assert (
        done
        and done[0]["model_version"] == "2026-12-01.2"
        and done[0]["previous_version"] == "2026-12-01.1"
    )
    assert {"ts", "level", "logger", "msg"} <= set(done[0])


def test_during_a_drain_503s_close_the_connection_are_not_in_flight_and_the_drain_ends_with_the_work(
    start_runtime,
):
    m = rt_models.Instrumented()
    svc = start_runtime(m, max_batch_size=1, drain_timeout_s=30)
    rt = svc.runtime
    stuck, stuck_out = in_thread(
        lambda: Client(svc.port).predict([rt_models.GATE_VALUE, 0.0, 0.0, 0.0])
    )
    assert m.entered.wait(20)
    rt.request_stop("test")
    svc.http.begin_closing()
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def retrying_client() -> None:  # what a retrying client does to a draining node
        while not stop.is_set():
            status, headers, _ = Client(svc.port).predict([1.0, 1.0, 1.0, 1.0])
            answers.append((status, headers.get("Connection", "")))

    retry, _ = in_thread(retrying_client)
    wait_until(lambda: len(answers) >= 20, "20 refused retries")
    drained: list[float] = []
    waiter, _ = in_thread(lambda: drained.append(rt.drain(30)))
    time.sleep(0.2)
    assert not drained  # the accepted request is still running: the drain waits for it...
    t0 = time.monotonic()
    m.gate.set()
    waiter.join(10)
    assert drained == [True] and time.monotonic() - t0 < 5  # ...and ends with it, retries or not
    stop.set()
    retry.join(10)
    stuck.join(10)
    assert stuck_out[0][0] == 200
    assert answers and all(a == (503, "close") for a in answers)
    text = rt.metrics_text().decode()
    assert metric_value(text, "torchfleet_inflight_requests") == 0


def test_a_request_whose_body_is_still_arriving_at_the_drain_is_answered_in_full(start_runtime):
    """Headers accepted before SIGTERM, last body bytes after it: the drain waits for the body
    and the model and answers 200, instead of ending at once (nothing admitted yet) and
    resetting the upload, or answering 503 work the node had already accepted."""
    svc = start_runtime(rt_models.Tiny(), max_batch_size=4, drain_timeout_s=30)
    rt = svc.runtime
    x = [[0.5, -1.0, 2.0, 3.0]]
    body = json.dumps({"inputs": x}).encode()
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
    try:
        head = (
            f"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body[:5])
        wait_until(
            lambda: metric_value(rt.metrics_text().decode(), "torchfleet_inflight_requests") == 1,
            "the request's headers to be in",
        )
        rt.request_stop("test")
        svc.http.begin_closing()
        drained: list[bool] = []
        waiter, _ = in_thread(lambda: drained.append(rt.drain(30)))
        time.sleep(0.3)
        assert not drained, "the drain ended while an accepted request's body was arriving"
        # A new request during the drain is still refused.
        status, _, doc = Client(svc.port).predict(x[0])
        assert status == 503 and doc["error"]["type"] == "not_ready"
        sock.sendall(body[5:])
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b"connection: close" in head.lower()
    with torch.inference_mode():
        expected = rt_models.Tiny()(torch.tensor(x))
    assert torch.allclose(torch.tensor(json.loads(payload)["outputs"]), expected, atol=1e-5)
    waiter.join(10)
    assert drained == [True]
