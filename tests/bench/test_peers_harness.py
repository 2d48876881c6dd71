"""The logic of the peer benchmark (benchmarks/peers/): wrk output parsing, repetition medians,
the ratio table, the answer check and the process-tree figures. The wrk outputs under data/
are real: captured from `make bench-peers` runs (wrk_<server>_c<N>.txt) and from wrk against
loopback sockets that answer 501, close at once, never answer, or refuse
(wrk_non2xx/socket_errors/timeout/refused).
No peer is installed or started here.
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torchfleet_bench.peers import bench, models, proctree, report, wrk

DATA = Path(__file__).with_name("data")
SERVER_SAMPLES = sorted(DATA.glob("wrk_*_c*.txt"))


def without_json_line(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("WRK_JSON "))


# --------------------------------------------------------------------------- wrk output


def test_samples_are_present():
    assert len(SERVER_SAMPLES) >= 8, SERVER_SAMPLES


@pytest.mark.parametrize("sample", SERVER_SAMPLES, ids=lambda p: p.stem)
def test_json_line_and_text_summary_agree(sample):
    """post.lua's exact line and wrk's rounded text give the same result, within rounding."""
    text = sample.read_text()
    exact, printed = wrk.parse(text), wrk.parse(without_json_line(text))
    assert (exact.source, printed.source) == ("json", "text")
    assert exact.requests == printed.requests > 0
    assert exact.non_2xx == printed.non_2xx == 0
    assert exact.socket_errors == printed.socket_errors
    assert exact.duration_s == pytest.approx(printed.duration_s, abs=0.01)
    for q in ("p50", "p90", "p99", "max"):
        assert exact.latency_ms[q] == pytest.approx(printed.latency_ms[q], rel=0.01, abs=0.01), q
    # req/s is the count over the measured duration, the figure wrk prints as Requests/sec
    wrk_rps = float(text.split("Requests/sec:")[1].split()[0])
    assert exact.req_per_s == pytest.approx(wrk_rps, rel=0.01)


def test_a_known_sample_parses_to_its_numbers():
    r = wrk.parse((DATA / "wrk_torchfleet_c1.txt").read_text())
    assert r.requests == 6 and r.ok == 6 and r.errors == 0
    assert r.duration_s == pytest.approx(2.020448)
    assert r.latency_ms["p50"] == pytest.approx(251.429)
    assert r.latency_ms["p99"] == pytest.approx(544.993)


def test_non_2xx_answers_are_errors_not_throughput():
    text = (DATA / "wrk_non2xx.txt").read_text()
    for r in (wrk.parse(text), wrk.parse(without_json_line(text))):
        assert r.requests == 1036 and r.non_2xx == 1036
        assert r.ok == 0 and r.req_per_s == 0.0 and r.errors == 1036
    assert wrk.parse(text).as_dict()["req_per_s"] == 0.0


def test_socket_errors_and_no_latency_when_nothing_was_answered():
    text = (DATA / "wrk_socket_errors.txt").read_text()
    for r in (wrk.parse(text), wrk.parse(without_json_line(text))):
        assert r.requests == 0
        assert r.socket_errors == {"connect": 0, "read": 17405, "write": 0, "timeout": 0}
        assert r.errors == 17405
        assert r.latency_ms["p50"] is None and r.latency_ms["max"] is None


def test_a_server_that_never_answers_shows_as_no_requests():
    """wrk counts no timeout for connections that never got an answer (its timeouts are per
    answered request): the harness sees 0 requests in the window, which it flags as underfilled."""
    r = wrk.parse((DATA / "wrk_timeout.txt").read_text())
    assert r.requests == 0 and r.errors == 0 and r.req_per_s == 0.0
    assert r.latency_ms["p99"] is None


def test_output_without_a_result_is_an_error():
    with pytest.raises(wrk.WrkError, match="no result"):
        wrk.parse((DATA / "wrk_refused.txt").read_text())


@pytest.mark.parametrize(
    "text, ms", [("250.00us", 0.25), ("12.5ms", 12.5), ("1.02s", 1020.0), ("2.00m", 120000.0)]
)
def test_wrk_durations(text, ms):
    assert wrk._ms(text) == pytest.approx(ms)


def test_wrk_command_never_has_more_threads_than_connections():
    cmd = wrk.command("http://127.0.0.1:1/x", Path("b.json"), 1, 5, 2, 30)
    assert cmd[cmd.index("-t") + 1] == "1" and cmd[cmd.index("--timeout") + 1] == "30s"
    assert cmd[-2:] == ["--", "b.json"] and str(wrk.LUA) in cmd


class _Echo(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(body)
        out = json.dumps({"ok": self.headers["Content-Type"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.mark.skipif(
    not shutil.which("wrk"), reason="wrk is not installed (benchmarks/peers/install.sh)"
)
def test_post_lua_sends_the_body_file_to_a_real_server(tmp_path):
    """Real wrk with post.lua against a loopback server: every request carries the file."""
    body = tmp_path / "body.json"
    body.write_bytes(json.dumps({"inputs": [[0.1234, -1.5], [2.0, 0.0]]}).encode())
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res, raw = wrk.run(f"http://127.0.0.1:{srv.server_port}/v1/predict", body, 2, 1.0, 2, 5)
    finally:
        srv.shutdown()
    assert res.source == "json" and res.requests > 10 and res.errors == 0, raw
    assert set(_Echo.bodies) == {body.read_bytes()}


# --------------------------------------------------------------------------- repetitions


def level(c: int, sample: str, **extra):
    lv = {"concurrency": c, **wrk.parse((DATA / sample).read_text()).as_dict(), **extra}
    return lv


def fake_run(key: str, rep: int, rps: dict[int, float], **extra):
    """A run whose levels are real parsed samples with req/s set per level."""
    server, threads = report.split_key(key)
    levels = []
    for c, value in rps.items():
        lv = level(c, f"wrk_{server}_c{1 if c == 1 else 8}.txt", cpu_ms_per_req=10.0 + rep)
        lv["req_per_s"] = value
        levels.append(lv)
    return {
        "key": key,
        "server": server,
        "threads": threads,
        "repetition": rep,
        "levels": levels,
        "start_to_ready_s": 1.0 + rep,
        "first_request_ms": 300.0,
        "fresh_ms": [100.0, 200.0 + 50 * rep, 1000.0, 200.0 + 50 * rep, 200.0 + 50 * rep],
        "peak_rss_mb": 100.0 * rep,
        "peak_pss_mb": 80.0 * rep,
        "processes": 1,
        "sigterm_to_exit_s": 0.5,
        **extra,
    }


def test_stats_median_min_max_ignore_missing():
    assert report.stats([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert report.stats([4.0, 1.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 2}
    assert report.stats([None]) == {"median": None, "min": None, "max": None, "n": 0}


def test_summary_is_the_median_of_the_repetitions_and_lists_failures():
    runs = [
        fake_run("torchfleet", 1, {1: 10.0, 32: 90.0}),
        fake_run("torchfleet", 2, {1: 30.0, 32: 70.0}),
        fake_run("torchfleet", 3, {1: 20.0, 32: 110.0}),
        {
            "key": "torchfleet",
            "server": "torchfleet",
            "threads": "default",
            "repetition": 4,
            "levels": [],
            "error": "not ready after 180 s",
        },
    ]
    s = report.summarize(runs)["torchfleet"]
    assert s["levels"]["1"]["req_per_s"] == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert s["levels"]["32"]["req_per_s"]["median"] == 90.0
    assert s["levels"]["1"]["cpu_ms_per_req"]["median"] == 12.0
    assert s["start_to_ready_s"]["median"] == 3.0 and s["peak_rss_mb"]["max"] == 300.0
    assert s["repetitions"] == 3 and s["failures"] == ["not ready after 180 s"]
    # first request / the same run's steady p50 at c=1 (the sample's p50: 251.429 ms)
    assert s["first_over_steady_p50"]["median"] == pytest.approx(300.0 / 251.429, abs=1e-3)
    # and over the median of the same client's next fresh-connection requests (250, 300, 350 ms
    # by repetition, the outliers 100 and 1000 ms left out by the median)
    assert s["first_over_fresh"] == {"median": 1.0, "min": 0.857, "max": 1.2, "n": 3}


def three_servers(rps_ours: float, rps_mosec: float, rps_ls: float, key_suffix: str = ""):
    runs = []
    for rep in (1, 2, 3):
        runs += [
            fake_run("torchfleet" + key_suffix, rep, {1: 50.0, 32: rps_ours + rep}),
            fake_run("mosec" + key_suffix, rep, {1: 40.0, 32: rps_mosec + rep}),
            fake_run("litserve" + key_suffix, rep, {1: 60.0, 32: rps_ls + rep}),
        ]
    return runs


def test_ratio_to_the_best_peer_and_served_over_offline():
    summary = report.summarize(three_servers(99.0, 49.0, 29.0))
    # the peers are held to the file's offline limit, torchfleet to that of the graph it serves
    rat = report.ratios(summary, {"default": 200.0}, {"default": 300.0})
    at32, at1 = (
        rat["ours_over_best_peer"]["default"]["32"],
        rat["ours_over_best_peer"]["default"]["1"],
    )
    assert at32["best_peer"] == "mosec" and at32["ratio"] == pytest.approx(101.0 / 51.0, abs=1e-3)
    assert at32["ranking"] == ["torchfleet", "mosec", "litserve"]
    assert at1["best_peer"] == "litserve" and at1["ratio"] == pytest.approx(50.0 / 60.0, abs=1e-3)
    assert rat["served_over_offline"]["torchfleet"]["32"] == pytest.approx(101.0 / 300.0, abs=1e-3)
    assert rat["served_over_offline"]["mosec"]["32"] == pytest.approx(51.0 / 200.0, abs=1e-3)


def test_omp1_rows_are_compared_among_themselves_and_ranking_changes_are_found():
    runs = three_servers(99.0, 49.0, 29.0) + three_servers(40.0, 60.0, 20.0, "@omp1")
    summary = report.summarize(runs)
    rat = report.ratios(summary, {"default": 200.0, "1": 150.0})
    omp1 = rat["ours_over_best_peer"]["1"]["32"]
    assert omp1["best_peer"] == "mosec" and omp1["ratio"] == pytest.approx(42.0 / 62.0, abs=1e-3)
    assert rat["served_over_offline"]["mosec@omp1"]["32"] == pytest.approx(62.0 / 150.0, abs=1e-3)
    assert report.ranking_changes(rat) == {"1": False, "32": True}


def test_rendered_table_shows_every_server_ratio_and_failure():
    runs = three_servers(99.0, 49.0, 29.0)
    runs.append(
        {
            "key": "litserve",
            "server": "litserve",
            "threads": "default",
            "repetition": 4,
            "levels": [],
            "error": "answer differs",
        }
    )
    runs[1]["levels"][1]["underfilled"] = True  # mosec rep 1, c=32
    summary = report.summarize(runs)
    assert summary["mosec"]["levels"]["32"]["underfilled"] == 1
    text = report.render(summary, report.ratios(summary, {"default": 200.0}), "== title")
    lines = text.splitlines()
    assert lines[0] == "== title"
    req_rows = lines[lines.index("req/s, median [min-max] of the repetitions") + 2 :][:3]
    assert req_rows[0].split()[0] == "torchfleet"  # ours first
    assert "101.0 [100.0-102.0]" in req_rows[0]
    assert any("1.98 vs mosec" in line for line in lines)
    assert any("FAILED: answer differs" in line for line in lines)
    assert any(
        line.startswith("fewer answers than connections") and "mosec c=32 (1x)" in line
        for line in lines
    )


# --------------------------------------------------------------------------- answer check, body


def test_answer_check_accepts_batching_noise_and_rejects_a_wrong_answer():
    expected = [0.5, -0.25, 1e-5]
    ok = bench.check_answer(
        "x", json.dumps({"outputs": [0.50002, -0.25001, 2e-5]}).encode(), expected
    )
    assert ok["correct"] and ok["max_abs_diff"] == pytest.approx(2e-5)
    with pytest.raises(RuntimeError, match="differs"):
        bench.check_answer("x", json.dumps({"outputs": [0.51, -0.25, 0.0]}).encode(), expected)
    with pytest.raises(RuntimeError, match="no 'outputs'"):
        bench.check_answer("x", b'{"error": "boom"}', expected)
    with pytest.raises(RuntimeError, match="2 outputs"):
        bench.check_answer("x", b'{"outputs": [0.5, -0.25]}', expected)


def test_the_body_is_deterministic_one_instance_of_4_decimals():
    body = models.body_bytes((3, 64, 64))
    assert body == models.body_bytes((3, 64, 64)) and len(body) == 91277  # the 91 KB
    inputs = json.loads(body)["inputs"]
    assert (len(inputs), len(inputs[0]), len(inputs[0][0])) == (3, 64, 64)
    assert all(round(v, 4) == v for v in inputs[2][63])


# --------------------------------------------------------------------------- process tree


def test_process_tree_counts_children_memory_and_cpu():
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20); import time; time.sleep(30)'])\n"
            "while time.process_time() < 0.3: pass\n"  # 0.3 s of CPU of its own, however loaded
            "c.wait()",
        ],
    )
    try:
        deadline = time.time() + 10
        while len(proctree.tree(parent.pid)) < 2 or proctree.memory_mb(parent.pid)[0] < 64:
            assert time.time() < deadline, "the child did not start"
            time.sleep(0.05)
        rss, pss, n = proctree.memory_mb(parent.pid)
        assert n == 2 and rss >= 64 and 0 < pss <= rss + 1
        with proctree.PeakSampler(parent.pid, interval=0.05) as s:
            time.sleep(0.4)
        assert s.peak_rss_mb >= 64 and s.max_processes == 2
        deadline = time.time() + 20
        while proctree.cpu_s(parent.pid) < 0.25:  # the parent's busy loop, seen from /proc
            assert time.time() < deadline, proctree.cpu_s(parent.pid)
            time.sleep(0.05)
    finally:
        for pid in reversed(proctree.tree(parent.pid)):
            subprocess.run(["kill", str(pid)], check=False)
        parent.wait(timeout=10)
