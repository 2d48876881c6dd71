"""Edge processes in front of the model owner (edge.py, edges.py, handoff.py): no torch in an
edge, slots reused without corrupting an answer, a full ring, an edge killed under load, the
owner killed, metrics counted once, and the drain race on an idle keep-alive connection."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import threading
import time

import pytest
import rt_models
import torch
from rt_helpers import Client, ServeProcess, metric_value, wait_until
from torchfleet_runtime import edges

pytestmark = pytest.mark.timeout(120)


def _expected(x: list[float]) -> list[float]:
    return rt_models.expected(torch.tensor([x]))[0].tolist()


def _raw_predict(port: int, x: list[float]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/predict",
            struct.pack("<4f", *x),
            {
                "Content-Type": "application/octet-stream",
                "X-Shape": "4",
                "X-Dtype": "float32",
                "Accept": "application/octet-stream",
            },
        )
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_an_edge_process_runs_without_torch(start_runtime):
    svc = start_runtime(rt_models.tiny(), edge_workers=2)
    pids = svc.http.pids()
    assert len(pids) == 2 and os.getpid() not in pids
    assert Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])[0] == 200
    with open(f"/proc/{os.getpid()}/maps") as f:
        assert "libtorch" in f.read()  # the check below can see torch where it is loaded
    for pid in pids:
        with open(f"/proc/{pid}/maps") as f:
            assert "libtorch" not in f.read()


def test_slot_reuse_never_mixes_up_answers(start_runtime, monkeypatch):
    """Far more distinct requests than slots, JSON and binary: every answer is its own input's."""
    monkeypatch.setattr(edges, "RING_SLOTS", 3)
    svc = start_runtime(rt_models.tiny(), edge_workers=2, max_batch_size=4)
    wrong: list[str] = []
    done = [0]
    lock = threading.Lock()

    def client(k: int) -> None:
        c = Client(svc.port)
        deadline = time.monotonic() + 60
        for i in range(30):
            x = [float(k), float(i), float(k * i % 7), 0.5 * i]
            while time.monotonic() < deadline:  # a full ring says 503 queue_full: retry
                if i % 2:
                    status, _, body = _raw_predict(svc.port, x)
                    got = list(struct.unpack("<3f", body)) if status == 200 else None
                else:
                    status, _, doc = c.predict(x)
                    got = doc.get("outputs")
                if status != 503:
                    break
            want = _expected(x)
            if (
                status != 200
                or got is None
                or any(abs(a - b) > 1e-4 for a, b in zip(got, want, strict=True))
            ):
                with lock:
                    wrong.append(f"client {k} request {i}: {status} {got} != {want}")
            with lock:
                done[0] += 1
        c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert done[0] == 8 * 30 and not wrong, wrong[:5]


def test_bodies_and_answers_larger_than_a_slot_travel_in_their_frames(start_runtime, monkeypatch):
    monkeypatch.setattr(edges, "RING_SLOT_BYTES", 8)  # 4 float32 in, 3 out: neither fits
    svc = start_runtime(rt_models.tiny(), edge_workers=1)
    c = Client(svc.port)
    for i in range(5):
        x = [float(i), 2.0, -1.0, 0.25]
        status, _, doc = c.predict(x)
        assert status == 200 and doc["outputs"] == pytest.approx(_expected(x), abs=1e-4)
        status, headers, body = _raw_predict(svc.port, x)
        assert status == 200 and headers["X-Shape"] == "3" and headers["X-Dtype"] == "float32"
        assert list(struct.unpack("<3f", body)) == pytest.approx(_expected(x), abs=1e-4)
    status, _, doc = c.predict([[1.0, 2.0, 3.0, 4.0]] * 3)  # a batch, inline both ways
    assert (
        status == 200
        and doc["outputs"] == [pytest.approx(_expected([1.0, 2.0, 3.0, 4.0]), abs=1e-4)] * 3
    )


def test_a_full_ring_answers_503_with_retry_after_and_loses_nothing(start_runtime, monkeypatch):
    monkeypatch.setattr(edges, "RING_SLOTS", 2)
    m = rt_models.Instrumented()
    svc = start_runtime(m, edge_workers=1, max_batch_size=1)
    gated = [rt_models.GATE_VALUE, 1.0, 2.0, 3.0]
    results: list[tuple[int, dict[str, str], object]] = []
    lock = threading.Lock()

    def send(x: list[float]) -> None:
        r = Client(svc.port).predict(x)
        with lock:
            results.append(r)

    held = [
        threading.Thread(target=send, args=([*gated[:1], float(i), 2.0, 3.0],)) for i in range(2)
    ]
    for t in held:
        t.start()
    rt = svc.runtime
    wait_until(
        lambda: metric_value(rt.metrics_text().decode(), "torchfleet_inflight_requests") == 2,
        "two predictions in flight",
    )
    status, headers, doc = Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 503 and doc["error"]["type"] == "queue_full" and headers["Retry-After"]
    m.gate.set()
    for t in held:
        t.join(30)
    assert sorted(r[0] for r in results) == [200, 200]
    got = sorted(tuple(round(v, 4) for v in doc["outputs"]) for _, _, doc in results)  # type: ignore[index]
    want = sorted(
        tuple(round(v, 4) for v in _expected([gated[0], float(i), 2.0, 3.0])) for i in range(2)
    )
    assert got == want
    assert Client(svc.port).predict([1.0, 2.0, 3.0, 4.0])[2]["outputs"] == pytest.approx(
        _expected([1.0, 2.0, 3.0, 4.0]), abs=1e-4
    )
    text = rt.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", 'code="200"') == 3
    assert metric_value(text, "torchfleet_requests_total", 'code="503"') == 1


def test_an_edge_killed_under_load_is_replaced_and_only_its_requests_fail(start_runtime):
    svc = start_runtime(rt_models.tiny(), edge_workers=2)
    victim = svc.http.pids()[0]
    stop = threading.Event()
    ok = [0]
    failed: list[str] = []
    lock = threading.Lock()

    def load(k: int) -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            x = [float(k), 1.0, 2.0, 3.0]
            try:
                status, _, doc = Client(svc.port).predict(x)  # a fresh connection each time
                good = status == 200 and doc["outputs"] == pytest.approx(_expected(x), abs=1e-4)
                with lock:
                    if good:
                        ok[0] += 1
                    else:
                        failed.append(f"{status} {doc}")
            except (ConnectionError, http.client.HTTPException) as exc:
                # a connection the killed edge held: reset, closed, or its pipe broken
                lost = isinstance(
                    exc,
                    (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead),
                )
                with lock:
                    failed.append("connection lost" if lost else repr(exc))

    threads = [threading.Thread(target=load, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: ok[0] >= 20, "load running")
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: (
            metric_value(svc.runtime.metrics_text().decode(), "torchfleet_edge_restarts_total") == 1
            and len(svc.http.pids()) == 2
        ),
        "the edge replaced",
    )
    before = ok[0]
    wait_until(lambda: ok[0] >= before + 40, "load served after the restart")
    stop.set()
    for t in threads:
        t.join(30)
    # only the killed edge's connections could fail (one in flight per client at most), never
    # with a wrong answer or an HTTP error
    assert len(failed) <= 4 and set(failed) <= {"connection lost"}, failed
    assert victim not in svc.http.pids()


def test_metrics_count_each_request_once_across_edges(start_runtime):
    svc = start_runtime(rt_models.tiny(), edge_workers=2)
    for i in range(20):
        assert Client(svc.port).predict([float(i), 0.0, 0.0, 0.0])[0] == 200
    for _ in range(5):  # errors decided in an edge count once too
        assert Client(svc.port).predict([1.0])[0] == 400
    text = svc.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_requests_total", 'code="200"') == 20
    assert metric_value(text, "torchfleet_requests_total", 'code="400"') == 5
    assert metric_value(text, "torchfleet_request_duration_seconds_count") == 20
    assert metric_value(text, "torchfleet_edge_workers") == 2
    assert metric_value(text, "torchfleet_inflight_requests") == 0
    # /metrics through an edge is the owner's one exposition
    _, _, body = Client(svc.port).call("GET", "/metrics")
    assert metric_value(body.decode(), "torchfleet_requests_total", 'code="200"') == 20
    _, card = Client(svc.port).get_json("/v1/model")
    assert card["edge_workers"] == 2 and card["edge_restarts"] == 0


@pytest.fixture
def served(tmp_path):
    started: list[ServeProcess] = []
    weights = tmp_path / "weights.pt"
    torch.save(rt_models.tiny().state_dict(), weights)

    def start(*extra: str) -> ServeProcess:
        p = ServeProcess(
            [
                "--model",
                str(weights),
                "--factory",
                "rt_models:tiny",
                "--input-shape",
                "4",
                "--edge-workers",
                "2",
                *extra,
            ],
            {"PYTHONPATH": os.path.dirname(rt_models.__file__)},
        )
        started.append(p)
        c = Client(p.port)
        wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "the server to be ready", 60)
        c.close()
        return p

    yield start
    for p in started:
        p.kill()


def _edge_pids(owner: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == owner and b"torchfleet_runtime.edge" in cmd:
                out.append(int(entry))
    return out


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n")
            return s.recv(100) == b""
    except OSError:
        return True


def test_the_owner_killed_takes_the_node_out(served):
    p = served()
    pids = _edge_pids(p.proc.pid)
    assert len(pids) == 2
    p.proc.kill()
    p.proc.wait(10)
    wait_until(
        lambda: not any(os.path.exists(f"/proc/{pid}/cmdline") and _alive(pid) for pid in pids),
        "the edges to exit",
        20,
    )
    assert _refused(p.port)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_request_on_an_idle_keepalive_connection_at_sigterm_gets_an_answer(served):
    """The drain race: requests sent on idle keep-alive connections just as SIGTERM arrives are
    answered (200 while admitted, else 503 with Connection: close), never reset."""
    p = served()
    conns = []
    for _ in range(6):
        c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
        c.request("GET", "/livez")
        assert c.getresponse().read()
        conns.append(c)
    body = json.dumps({"inputs": [1.0, 2.0, 3.0, 4.0]}).encode()
    p.proc.send_signal(signal.SIGTERM)
    statuses = []
    for i, c in enumerate(conns):
        time.sleep(0.002 * i)
        c.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
        r = c.getresponse()  # a reset or a closed connection raises here
        r.read()
        statuses.append(r.status)
        if r.status == 503:
            assert r.getheader("Connection") == "close" and r.getheader("Retry-After")
    assert set(statuses) <= {200, 503}, statuses
    assert p.wait(30) == 0


def test_edge_workers_auto_leaves_the_owner_its_cpus_and_bad_values_are_refused():
    from torchfleet_runtime.config import Config, ConfigError, load_config

    cfg = Config()
    assert edges.edge_workers(cfg, on_gpu=True, cpus=16) == 15  # the owner keeps one CPU
    assert edges.edge_workers(cfg, on_gpu=False, cpus=16) == 4  # the model's threads keep most
    assert edges.edge_workers(cfg, on_gpu=False, cpus=2) == 0  # no core to spare: in-process
    assert edges.edge_workers(cfg, on_gpu=False, cpus=4) == 1
    assert edges.edge_workers(cfg, on_gpu=True, cpus=1) == 1
    assert edges.edge_workers(cfg.replace(edge_workers=3), on_gpu=True, cpus=16) == 3
    assert edges.edge_workers(cfg.replace(edge_workers=0), on_gpu=True, cpus=16) == 0
    assert load_config({"edge_workers": "auto"}, env={})[0].edge_workers is None
    with pytest.raises(ConfigError) as err:
        load_config({"edge_workers": "-1"}, env={})
    assert "edge_workers" in str(err.value) and "auto or an integer >= 0" in str(err.value)


@pytest.mark.parametrize(
    "outputs",
    [
        torch.randn(3, 5, generator=torch.Generator().manual_seed(0)),
        torch.randn(2, 2, 3, generator=torch.Generator().manual_seed(1)).to(torch.float16),
        {"logits": torch.randn(2, 4), "ids": torch.arange(2, dtype=torch.int64)},
        (torch.tensor([[True, False]]), torch.tensor([[1.5, -2.25]], dtype=torch.float64)),
    ],
)
def test_an_edge_encodes_the_same_bytes_as_the_owner_would(outputs):
    """JSON and raw answers built from the bytes (wire.py, in an edge) are byte for byte the
    answers built from the tensors (codec.py, one process)."""
    from torchfleet_runtime import codec, wire
    from torchfleet_runtime.errors import ApiError

    for batched in (True, False):
        structure, parts, non_finite = codec.output_parts(outputs, for_json=True)
        assert wire.encode_json(structure, parts, batched, non_finite, False) == codec.encode_json(
            outputs, batched
        )
        structure, parts, _ = codec.output_parts(outputs, for_json=False)
        if isinstance(outputs, torch.Tensor):
            assert wire.encode_raw(parts[0], batched) == codec.encode_raw(outputs, batched)
        else:
            with pytest.raises(ApiError):
                codec.encode_raw(outputs, batched)
