"""The load generator (`torchfleet-bench load`, benchmarks/torchfleet_bench) against a real
loopback HTTP server written here: a stub that honours the runtime's HTTP contract (GET
/v1/model, POST /v1/predict in JSON or binary) with a controllable latency, 503 injection and
dropped connections. Plus the offline mode on a tiny TorchScript model, and the percentile math
against numpy."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from torchfleet_bench import load as bench
from torchfleet_bench.levels import latency_summary, percentile, run_level
from torchfleet_bench.load import parse_concurrency

from infra.client import Target, build_payload

SHAPE = (3, 8, 8)


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, latency_s=0.0, fail_every=0, drop_every=0):
        super().__init__(("127.0.0.1", 0), StubHandler)
        self.latency_s = latency_s
        self.fail_every = fail_every  # every Nth prediction answers 503 + Retry-After
        self.drop_every = drop_every  # every Nth prediction closes the socket unanswered
        self.lock = threading.Lock()
        self.predictions = 0
        self.connections = 0
        self.requests = []  # (content type, x-shape, body length) per prediction
        self.delay = threading.Event()  # never set: wait(latency) is the model's compute time

    def process_request(self, request, client_address):
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the runtime's server

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        # headers and body leave in two writes; without NODELAY the body waits for the
        # client's delayed ACK (40 ms) and every latency in these tests would be TCP's
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, status, doc, extra=None):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/model":
            self._send(200, {"name": "stub", "input_shape": list(SHAPE), "dtype": "float32"})
        else:
            self._send(404, {"error": {"type": "not_found", "message": self.path}})

    def do_POST(self):
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ctype = self.headers.get("Content-Type", "")
        if self.path != "/v1/predict":
            return self._send(404, {"error": {"type": "not_found", "message": self.path}})
        if ctype == "application/json":
            batch = np.asarray(json.loads(body)["inputs"], dtype=np.float32)
        elif ctype == "application/octet-stream":
            dims = tuple(int(d) for d in self.headers["X-Shape"].split(","))
            assert self.headers["X-Dtype"] == "float32"
            batch = np.frombuffer(body, dtype="<f4").reshape(dims)
        else:
            return self._send(415, {"error": {"type": "unsupported_media_type", "message": ctype}})
        if batch.shape[1:] != SHAPE:
            return self._send(400, {"error": {"type": "wrong_shape", "message": str(batch.shape)}})
        with srv.lock:
            srv.predictions += 1
            n = srv.predictions
            srv.requests.append((ctype, self.headers.get("X-Shape"), len(body)))
        if srv.drop_every and n % srv.drop_every == 0:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if srv.fail_every and n % srv.fail_every == 0:
            return self._send(
                503,
                {"error": {"type": "overloaded", "message": "queue full"}},
                {"Retry-After": "1"},
            )
        if srv.latency_s:
            srv.delay.wait(srv.latency_s)
        return self._send(200, {"outputs": [[0.0] * 10 for _ in range(batch.shape[0])]})


@pytest.fixture
def stub():
    servers = []

    def start(**kwargs):
        srv = StubServer(**kwargs)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def cli(*argv):
    return bench.main([str(a) for a in argv])


# --------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy(n):
    values = sorted(np.random.default_rng(n).exponential(size=n).tolist())
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="101"):
        percentile([1.0], 101)


def test_latency_summary_in_milliseconds():
    summary = latency_summary([0.001, 0.002, 0.003, 0.004])
    assert summary["p50"] == pytest.approx(2.5)
    assert (summary["min"], summary["max"], summary["mean"]) == (1.0, 4.0, 2.5)
    assert set(latency_summary([]).values()) == {None}


def test_parse_concurrency():
    assert parse_concurrency("1,8, 32,64") == [1, 8, 32, 64]
    for bad in ("", "0", "1,x", "-4"):
        with pytest.raises(Exception, match="--concurrency"):
            parse_concurrency(bad)


@pytest.mark.parametrize(
    ("url", "host", "port", "prefix"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1", 8080, ""),
        ("http://node:9000/v1/predict", "node", 9000, ""),
        ("127.0.0.1:8080/", "127.0.0.1", 8080, ""),
        ("http://gw/models/a/v1/model", "gw", 80, "/models/a"),
    ],
)
def test_target_parse(url, host, port, prefix):
    t = Target.parse(url)
    assert (t.host, t.port, t.prefix) == (host, port, prefix)


def test_binary_payload_is_the_same_tensor_as_json():
    raw, headers = build_payload(SHAPE, "float32", 2, binary=True)
    doc, json_headers = build_payload(SHAPE, "float32", 2, binary=False)
    assert headers["X-Shape"] == "2,3,8,8" and headers["X-Dtype"] == "float32"
    assert json_headers["Content-Type"] == "application/json"
    from_bytes = np.frombuffer(raw, dtype="<f4").reshape(2, *SHAPE)
    from_json = np.asarray(json.loads(doc)["inputs"], dtype=np.float32)
    np.testing.assert_array_equal(from_bytes, from_json)
    bf16, _ = build_payload(SHAPE, "bfloat16", 1, binary=True)
    assert len(bf16) == 2 * 3 * 8 * 8  # two bytes per element, no numpy needed
    as_f32 = np.frombuffer(
        b"".join(b"\0\0" + bf16[i : i + 2] for i in range(0, len(bf16), 2)), dtype="<f4"
    )
    np.testing.assert_array_equal(
        as_f32, from_bytes[0].reshape(-1)
    )  # the values are exact in bfloat16
    short, _ = build_payload(SHAPE, "float32", 1, binary=False, decimals=2)
    assert len(short) < len(doc) / 2 * 0.7


# --------------------------------------------------------------------------- closed loop


def test_request_bound_counts_errors_and_keeps_connections_alive(stub):
    srv = stub(fail_every=5)
    body, headers = build_payload(SHAPE, "float32", 1, binary=False)
    result = run_level(
        Target.parse(srv.url), body, headers, concurrency=4, batch=1, requests=40, warmup=0
    )
    assert result.requests == 40 == srv.predictions
    assert result.ok == 32
    assert result.errors == {"503": 8}
    assert srv.connections == 4  # one keep-alive connection per worker, 503s included
    assert result.throughput_rps > 0
    assert result.items_per_s == pytest.approx(result.throughput_rps)
    assert result.latency_ms["p50"] <= result.latency_ms["p90"] <= result.latency_ms["p99"]


def test_dropped_connections_are_tallied_and_the_worker_reconnects(stub):
    srv = stub(drop_every=4)
    body, headers = build_payload(SHAPE, "float32", 1, binary=True)
    result = run_level(
        Target.parse(srv.url), body, headers, concurrency=2, batch=1, requests=20, warmup=0
    )
    assert result.requests == 20
    dropped = sum(v for k, v in result.errors.items() if k.startswith("conn:"))
    assert dropped == 5 and result.ok == 15
    # each drop but the last (the 20th request: nothing follows it) costs a reconnect
    assert srv.connections == 2 + 4


def test_latency_is_the_round_trip(stub):
    srv = stub(latency_s=0.02)
    body, headers = build_payload(SHAPE, "float32", 1, binary=False)
    result = run_level(
        Target.parse(srv.url), body, headers, concurrency=2, batch=1, requests=6, warmup=0
    )
    assert result.ok == 6
    assert result.latency_ms["min"] >= 20.0  # the server held every request at least 20 ms


def test_duration_bound_runs_until_the_deadline(stub):
    srv = stub()
    body, headers = build_payload(SHAPE, "float32", 1, binary=False)
    result = run_level(
        Target.parse(srv.url), body, headers, concurrency=2, batch=1, duration_s=0.3, warmup=0
    )
    assert result.requests == srv.predictions > 0
    assert result.elapsed_s >= 0.3


def test_the_window_opens_after_a_warm_up_longer_than_it(stub):
    srv = stub(latency_s=0.3)  # warm-up: 3 x 0.3 s per worker, longer than the 0.5 s window
    body, headers = build_payload(SHAPE, "float32", 1, binary=False)
    result = run_level(
        Target.parse(srv.url), body, headers, concurrency=3, batch=1, duration_s=0.5, warmup=3
    )
    assert result.ok >= 3  # every worker measured at least its first request
    assert srv.predictions == 3 * 3 + result.requests


def test_cli_json_report_binary_batches_and_warmup(stub, tmp_path):
    srv = stub()
    out = tmp_path / "bench.json"
    rc = cli(
        srv.url,
        "--concurrency",
        "1,3",
        "--requests",
        "12",
        "--batch",
        "2",
        "--binary",
        "--warmup",
        "2",
        "--json",
        out,
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["url"] == srv.url
    assert report["model"]["input_shape"] == list(SHAPE)
    assert report["config"]["body"] == "binary"
    assert report["config"]["input_shape"] == list(SHAPE)
    assert report["config"]["body_bytes"] == 2 * 3 * 8 * 8 * 4
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 3]
    for lv in report["levels"]:
        assert set(lv) >= {
            "requests",
            "ok",
            "errors",
            "throughput_rps",
            "items_per_s",
            "latency_ms",
        }
        assert lv["requests"] == lv["ok"] == 12
        assert lv["items_per_s"] == pytest.approx(2 * lv["throughput_rps"], rel=1e-3)
        assert set(lv["latency_ms"]) == {"p50", "p90", "p99", "mean", "min", "max"}
    # 1 checked probe + warm-up (2 per worker: 1 + 3 workers) + 2 x 12 measured
    assert srv.predictions == 1 + 2 * 4 + 24
    assert {r[:2] for r in srv.requests} == {("application/octet-stream", "2,3,8,8")}
    assert report["offline"] is None and report["served_over_offline"] is None


def test_unreachable_server_is_a_clear_error(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    assert cli(f"http://127.0.0.1:{port}", "--requests", "1") == 2
    assert f"GET http://127.0.0.1:{port}/v1/model" in capsys.readouterr().err


def test_wrong_input_stops_before_measuring(stub, capsys):
    srv = stub()
    assert cli(srv.url, "--requests", "50", "--shape", "3,9,9") == 2
    assert "answered 400" in capsys.readouterr().err
    assert srv.predictions == 0  # the probe was refused, and nothing else was sent


def test_bad_flags_name_the_value(capsys):
    with pytest.raises(SystemExit):
        cli("http://127.0.0.1:1", "--concurrency", "4,zero")
    assert "--concurrency '4,zero'" in capsys.readouterr().err
    assert cli() == 2
    assert "give a server URL, --offline MODEL, or both" in capsys.readouterr().err


# --------------------------------------------------------------------------- plot


def test_plot_writes_a_png(stub, tmp_path):
    pytest.importorskip("matplotlib")
    srv = stub()
    png = tmp_path / "latency.png"
    assert cli(srv.url, "--concurrency", "1,2", "--requests", "4", "--plot", png) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(stub, monkeypatch, capsys, tmp_path):
    srv = stub()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    assert cli(srv.url, "--requests", "4", "--plot", tmp_path / "x.png") == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert srv.predictions == 0  # checked before any load is sent


# --------------------------------------------------------------------------- offline


@pytest.fixture
def tiny_model(tmp_path):
    torch.manual_seed(0)
    model = torch.jit.script(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    )
    path = tmp_path / "tiny.pt"
    model.save(str(path))
    (tmp_path / "tiny.json").write_text(
        json.dumps({"input_shape": list(SHAPE), "dtype": "float32"})
    )
    return path


def test_offline_reports_every_batch_size_and_the_best(tiny_model, tmp_path):
    out = tmp_path / "offline.json"
    rc = cli(
        "--offline",
        tiny_model,
        "--offline-max-batch",
        "8",
        "--offline-seconds",
        "0.01",
        "--json",
        out,
    )
    assert rc == 0
    offline = json.loads(out.read_text())["offline"]
    assert [r["batch"] for r in offline["results"]] == [1, 2, 4, 8]
    assert offline["best"] == max(offline["results"], key=lambda r: r["items_per_s"])
    assert all(r["items_per_s"] > 0 for r in offline["results"])
    assert offline["device"] == "cpu"


def test_served_over_offline_ratio(stub, tiny_model, tmp_path):
    srv = stub()
    out = tmp_path / "both.json"
    rc = cli(
        srv.url,
        "--concurrency",
        "2",
        "--requests",
        "10",
        "--offline",
        tiny_model,
        "--offline-max-batch",
        "2",
        "--offline-seconds",
        "0.01",
        "--json",
        out,
    )
    assert rc == 0
    report = json.loads(out.read_text())
    best = report["offline"]["best"]["items_per_s"]
    served = report["levels"][0]["items_per_s"]
    assert report["served_over_offline"]["2"] == pytest.approx(served / best, abs=1e-3)


@pytest.mark.parametrize(
    "optimize, message",
    [
        ("auto", "the runtime cannot load it (config key 'model'"),  # its loader's own words
        ("off", "not a loadable TorchScript file"),
    ],
)
def test_offline_rejects_a_non_torchscript_file(tmp_path, capsys, optimize, message):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    assert cli("--offline", junk, "--shape", "4", "--optimize", optimize) == 2
    err = capsys.readouterr().err
    assert f"--offline {junk}" in err and message in err and "Traceback" not in err


def test_offline_needs_a_shape_without_sidecar(tmp_path, capsys):
    path = tmp_path / "bare.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(path))
    assert cli("--offline", path) == 2
    assert "--shape" in capsys.readouterr().err
    assert (
        cli(
            "--offline",
            path,
            "--shape",
            "4",
            "--offline-max-batch",
            "1",
            "--offline-seconds",
            "0.01",
        )
        == 0
    )


def test_the_command_runs_through_the_tools_cli(tiny_model):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchfleet_bench",
            "load",
            "--offline",
            str(tiny_model),
            "--offline-max-batch",
            "2",
            "--offline-seconds",
            "0.01",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    assert "offline best:" in proc.stdout
    assert Path(tiny_model).exists()
