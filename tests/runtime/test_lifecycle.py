"""Start-up, drain and spot interruption: a real `torchfleet-runtime serve` process receives
SIGTERM with requests in flight; a fake metadata server on loopback posts spot notices."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import rt_models
import torch
from conftest import Client, metric_value
from test_batching import in_thread, wait_until
from torchfleet_runtime.interruption import SpotWatcher

# A hang (a batch that never closes, a drain that never ends) fails fast instead of at 10 min.
pytestmark = pytest.mark.timeout(120)

CLI = str(Path(sys.executable).with_name("torchfleet-runtime"))


class ServeProcess:
    """`torchfleet-runtime serve` on a free port; the port is read from its 'listening on' log line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([CLI, "serve", "--port", "0", "--spot-watch", "off", *args],
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
        self.log: list[str] = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise AssertionError("serve exited before listening:\n" + "".join(self.log))
        self._reader = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def gated_server(tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(rt_models.file_gated().state_dict(), weights)
    gate = tmp_path / "gate"
    started: list[ServeProcess] = []

    def start(*extra: str) -> ServeProcess:
        env = {"PYTHONPATH": str(Path(rt_models.__file__).parent), "RT_GATE_FILE": str(gate)}
        p = ServeProcess(["--model", str(weights), "--factory", "rt_models:file_gated", "--input-shape", "4",
                          "--max-batch-size", "1", "--log-level", "info", *extra], env)
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
    wait_until(lambda: metric_value(c.call("GET", "/metrics")[2].decode(), "torchfleet_inflight_requests") == 4,
               "4 requests in flight")
    p.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: c.call("GET", "/readyz")[0] == 503, "/readyz to turn 503")
    status, headers, doc = c.predict([1.0, 2.0, 3.0, 4.0])
    assert status == 503 and doc["error"]["type"] == "not_ready" and headers["Retry-After"]
    gate.touch()  # let the model finish: every in-flight request must still be answered
    for (t, out), x in zip(workers, xs, strict=True):
        t.join(30)
        status, _, doc = out[0]
        assert status == 200
        assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x[None])[0], atol=1e-5)
    assert p.wait(30) == 0
    assert any("draining: SIGTERM" in line for line in p.log)


def test_drain_gives_up_after_the_timeout_and_still_exits_0(gated_server):
    start, _ = gated_server
    p = start("--drain-timeout-s", "0.5")
    c = Client(p.port)

    def stuck() -> str:
        try:
            Client(p.port).predict([rt_models.GATE_VALUE, 0.0, 0.0, 0.0])
        except (http.client.HTTPException, ConnectionError):
            return "cut off"
        return "answered"

    t, out = in_thread(stuck)
    wait_until(lambda: metric_value(c.call("GET", "/metrics")[2].decode(), "torchfleet_inflight_requests") == 1,
               "a stuck request")
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0  # the gate never opens: the drain timeout ends it
    t.join(10)
    assert out == ["cut off"]
    assert any("drain timeout: 1 request(s) still in flight" in line for line in p.log)


def test_a_bad_model_path_fails_start_up_with_a_clear_message(tmp_path):
    proc = subprocess.run([CLI, "serve", "--model", str(tmp_path / "missing.pt"), "--port", "0", "--spot-watch", "off",
                           "--input-shape", "4"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "config key 'model'" in proc.stderr and "missing.pt" in proc.stderr and "Traceback" not in proc.stderr


class FakeMetadata(BaseHTTPRequestHandler):
    """AWS IMDSv2 (token PUT, then token-authenticated GETs) and Alibaba's metadata paths."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        s = self.server
        if self.path == "/latest/api/token" and s.aws and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            s.tokens_issued += 1
            self._reply(200, "TOKEN-1")
        else:
            self._reply(404 if not s.aws else 400)

    def do_GET(self) -> None:
        s = self.server
        if self.path == "/latest/meta-data/spot/instance-action" and s.aws:
            if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN-1":
                self._reply(401)
            else:
                s.aws_polls += 1
                self._reply(200, s.aws_notice) if s.aws_notice else self._reply(404)
        elif self.path == "/latest/meta-data/instance/spot/termination-time" and s.ali:
            s.ali_polls += 1
            self._reply(200, s.ali_notice) if s.ali_notice else self._reply(404)
        elif self.path == "/latest/meta-data/instance-id" and s.ali:
            self._reply(200, "i-fake")
        else:
            self._reply(404)


@pytest.fixture
def metadata_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    srv.daemon_threads = True
    srv.aws, srv.ali = True, True
    srv.aws_notice = srv.ali_notice = ""
    srv.tokens_issued = srv.aws_polls = srv.ali_polls = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_a_spot_notice_drains_the_runtime(cloud, metadata_server, start_runtime, client_for):
    srv, url = metadata_server
    rt = start_runtime(rt_models.tiny(), max_batch_size=2, spot_watch=cloud, aws_metadata_url=url,
                       alicloud_metadata_url=url, spot_poll_interval_s=0.02)
    c = client_for(rt)
    wait_until(lambda: (srv.aws_polls if cloud == "aws" else srv.ali_polls) >= 2, "the watcher to poll")
    assert c.call("GET", "/readyz")[0] == 200 and c.predict([1.0, 2.0, 3.0, 4.0])[0] == 200
    if cloud == "aws":
        srv.aws_notice = json.dumps({"action": "terminate", "time": "2026-11-30T20:00:00Z"})
    else:
        srv.ali_notice = "2026-11-30T20:00:00Z"
    assert rt.runtime.stop_requested.wait(20)
    assert rt.runtime.state == "draining" and "spot" in rt.runtime.stop_reason
    assert c.call("GET", "/readyz")[0] == 503
    assert c.predict([1.0, 2.0, 3.0, 4.0])[0] == 503
    assert rt.runtime.drain(5)
    if cloud == "aws":
        assert srv.tokens_issued == 1  # the IMDSv2 token is reused, not fetched per poll


def test_auto_detects_the_cloud_or_turns_itself_off(metadata_server):
    srv, url = metadata_server
    # a closed port for the cloud that is "not here": connection refused, like a missing service
    with ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata) as closed:
        nowhere = f"http://127.0.0.1:{closed.server_address[1]}"

    def detect(aws: str, ali: str) -> str:
        return SpotWatcher("auto", aws, ali, 1.0, lambda _: None, timeout_s=2)._detect()

    assert detect(url, nowhere) == "aws"
    assert detect(nowhere, url) == "alicloud"
    srv.aws = False
    assert detect(url, url) == "alicloud"
    assert detect(nowhere, nowhere) == "off"


def test_sighup_reloads_the_model_in_the_same_process(tmp_path):
    path = tmp_path / "model.pt"
    torch.jit.script(rt_models.tiny()).save(str(path))
    meta = {"input_shape": [4], "name": "tiny", "version": "2026-12-01.1"}
    path.with_suffix(".json").write_text(json.dumps(meta))
    p = ServeProcess(["--model", str(path), "--max-batch-size", "2", "--log-level", "info", "--log-format", "json"], {})
    try:
        c = Client(p.port)
        wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "the server to be ready", 60)
        assert c.predict([1.0, 2.0, 3.0, 4.0])[1]["X-Model-Version"] == "2026-12-01.1"
        path.with_suffix(".json").write_text(json.dumps({**meta, "version": "2026-12-01.2"}))
        p.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: c.get_json("/v1/model")[1]["model_version"] == "2026-12-01.2", "the new version", 60)
        assert c.call("GET", "/readyz")[0] == 200 and p.proc.poll() is None  # the same process, still ready
        status, headers, _ = c.predict([1.0, 2.0, 3.0, 4.0])
        assert status == 200 and headers["X-Model-Version"] == "2026-12-01.2"
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        p.kill()
    lines = [json.loads(line) for line in p.log if line.startswith("{")]
    done = [r for r in lines if r["msg"].startswith("reload done")]
    assert done and done[0]["model_version"] == "2026-12-01.2" and done[0]["previous_version"] == "2026-12-01.1"
    assert {"ts", "level", "logger", "msg"} <= set(done[0])


def test_during_a_drain_503s_close_the_connection_are_not_in_flight_and_the_drain_ends_with_the_work(
        start_runtime):
    m = rt_models.Instrumented()
    svc = start_runtime(m, max_batch_size=1, drain_timeout_s=30)
    rt = svc.runtime
    stuck, stuck_out = in_thread(lambda: Client(svc.port).predict([rt_models.GATE_VALUE, 0.0, 0.0, 0.0]))
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
