"""`torchfleet-bench gpu-peers` (benchmarks/torchfleet_bench/gpu_peers.py): its configurations,
the table it prints (ratios to the best Mosec, served / offline) and wrk's extra headers. The
servers themselves run in the dry run (benchmarks/README.md), not here."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest
from torchfleet_bench import gpu_peers
from torchfleet_bench.peers import wrk


def test_configurations_are_the_edge_settings_and_the_decode_workers():
    cfgs = gpu_peers.configs("cuda", [1, 8])
    assert [c.key for c in cfgs] == [
        "torchfleet@edge1",
        "torchfleet@edge-auto",
        "mosec@decode1",
        "mosec@decode8",
    ]
    assert cfgs[1].env == {"TORCHFLEET_DEVICE": "cuda", "TORCHFLEET_EDGE_WORKERS": "auto"}
    assert cfgs[3].env == {"PEERS_DEVICE": "cuda", "PEERS_DECODE_WORKERS": "8"}
    assert cfgs[0].bodies == ("json", "binary") and cfgs[2].bodies == ("json",)


def level(body: str, c: int, rps: float, **extra):
    return {
        "body": body,
        "concurrency": c,
        "req_per_s": rps,
        "latency_ms": {"p50": 10.0, "p99": 40.0},
        "errors": 0,
        "rss_mb": 900.0,
        "processes": 1,
        **extra,
    }


def run(key: str, levels: list[dict]):
    return {"key": key, "server": key.split("@")[0], "levels": levels}


MODELS = {
    "demo": {
        "offline": {
            "results": [{"batch": 64, "items_per_s": 4000.0}, {"batch": 256, "items_per_s": 8000.0}]
        },
        "runs": [
            run("torchfleet@edge1", [level("json", 32, 600.0), level("binary", 32, 2000.0)]),
            run("torchfleet@edge-auto", [level("json", 32, 1600.0), level("binary", 32, 2400.0)]),
            run("mosec@decode1", [level("json", 32, 300.0)]),
            run(
                "mosec@decode8",
                [
                    level("json", 32, 800.0),
                    {"body": "json", "concurrency": 128, "skipped": "budget"},
                ],
            ),
        ],
    }
}


def test_rows_compare_the_best_of_each_server_and_the_offline_ceiling():
    table = gpu_peers.rows(MODELS)
    assert [(r["body"], r["concurrency"]) for r in table] == [("json", 32), ("binary", 32)]
    js, binary = table
    assert js["best_torchfleet"] == "torchfleet@edge-auto" and js["best_mosec"] == "mosec@decode8"
    assert js["ratio"] == 2.0  # 1600 / 800
    assert js["served_over_offline"] == 0.2  # 1600 / the best offline batch, 8000
    # Mosec serves JSON only: no ratio for binary bodies, and a skipped level is no figure
    assert binary["ratio"] is None and binary["served_over_offline"] == 0.3
    assert set(js["figures"]) == {
        "torchfleet@edge1",
        "torchfleet@edge-auto",
        "mosec@decode1",
        "mosec@decode8",
    }


def test_a_failed_run_leaves_its_cells_empty_not_its_ratio_wrong():
    models = {
        "demo": {
            "offline": {"error": "x"},
            "runs": [
                run("torchfleet@edge1", [level("json", 32, 500.0)]),
                {"key": "mosec@decode1", "error": "boom"},
            ],
        }
    }
    (row,) = gpu_peers.rows(models)
    assert row["ratio"] is None and row["served_over_offline"] is None and row["best_mosec"] is None


def test_the_rendered_table_puts_latency_and_memory_beside_each_figure():
    keys = [c.key for c in gpu_peers.configs("cuda", [1, 8])]
    text = gpu_peers.render(gpu_peers.rows(MODELS), keys)
    lines = text.splitlines()
    assert lines[0] == (
        "| model | body | c | torchfleet@edge1 | torchfleet@edge-auto | mosec@decode1 | "
        "mosec@decode8 | torchfleet / best Mosec | served / offline |"
    )
    assert lines[2] == (
        "| demo | json | 32 | 600 (10/40 ms, 900 MB) | 1600 (10/40 ms, 900 MB) | "
        "300 (10/40 ms, 900 MB) | 800 (10/40 ms, 900 MB) | 2.00 | 0.200 |"
    )
    assert lines[3].endswith("| - | - | - | 0.300 |")


def test_wrk_passes_the_binary_headers_to_post_lua():
    headers = {
        "Content-Type": "application/octet-stream",
        "X-Shape": "1,3,64,64",
        "X-Dtype": "float32",
    }
    cmd = wrk.command("http://127.0.0.1:1/v1/predict", Path("b.bin"), 8, 5, 2, 10, headers)
    assert cmd[cmd.index("--") :] == [
        "--",
        "b.bin",
        "application/octet-stream",
        "X-Shape: 1,3,64,64",
        "X-Dtype: float32",
    ]
    plain = wrk.command("http://127.0.0.1:1/v1/predict", Path("b.json"), 8, 5, 2, 10)
    assert plain[-2:] == ["--", "b.json"]


class _Headers(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str | None, str | None, str | None]] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(
            (self.headers["Content-Type"], self.headers["X-Shape"], self.headers["X-Dtype"])
        )
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.mark.skipif(
    not shutil.which("wrk"), reason="wrk is not installed (torchfleet-bench gpu-pack)"
)
def test_post_lua_sends_the_extra_headers_to_a_real_server(tmp_path):
    body = tmp_path / "body.bin"
    body.write_bytes(b"\0" * 64)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Headers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    headers = {"Content-Type": "application/octet-stream", "X-Shape": "1,16", "X-Dtype": "float32"}
    try:
        res, raw = wrk.run(
            f"http://127.0.0.1:{srv.server_port}/v1/predict", body, 2, 1.0, 1, 5, headers
        )
    finally:
        srv.shutdown()
    assert res.requests > 5 and res.errors == 0, raw
    assert set(_Headers.seen) == {("application/octet-stream", "1,16", "float32")}


def test_the_first_answer_on_a_gpu_allows_tf32_rounding_not_a_wrong_answer():
    from torchfleet_bench.peers import bench

    expected = [1.0, -2.0, 0.5]
    tf32 = json.dumps({"outputs": [1.004, -2.006, 0.503]}).encode()  # about 2**-10 relative
    wrong = json.dumps({"outputs": [1.2, -2.0, 0.5]}).encode()
    assert gpu_peers.tolerance("cpu") == (bench.RTOL, bench.ATOL)
    assert bench.check_answer("t", tf32, expected, gpu_peers.tolerance("cuda"))["correct"]
    with pytest.raises(RuntimeError, match="differs"):
        bench.check_answer("t", tf32, expected, gpu_peers.tolerance("cpu"))
    with pytest.raises(RuntimeError, match="differs"):
        bench.check_answer("t", wrong, expected, gpu_peers.tolerance("cuda"))


def test_an_unknown_model_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as done:
        gpu_peers.main(["--device", "cpu", "--models", "demo,huge"])
    assert done.value.code == 2
    assert "--models = 'demo,huge' is invalid; allowed: demo, wide" in capsys.readouterr().err
