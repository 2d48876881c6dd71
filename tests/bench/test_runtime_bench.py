"""`make bench` in miniature (`torchfleet-bench runtime`): real `torchfleet-runtime serve`
processes on the demo model, driven by the tool's closed loop, every ratio computed and every
server stopped by SIGTERM with exit code 0. The load generator's own tests are
tests/bench/test_load.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest


def test_runtime_benchmark_end_to_end(tmp_path):
    """`make bench` in miniature: real serve processes, the demo model, every ratio computed."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchfleet_bench",
            "runtime",
            "--concurrency",
            "1,2",
            "--duration",
            "0.3",
            "--offline-seconds",
            "0.05",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
            "--no-plot",
            "--wrk-seconds",
            "1",
            "--overhead-rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "runtime_bench_cpu.json").read_text())
    assert set(report["servers"]) == {"batching", "no-batching"}
    assert report["servers"]["no-batching"]["model"]["max_batch_size"] == 1
    summary = report["summary"]
    best = summary["offline_best_items_per_s"]
    # the ceiling is the graph the servers run (the runtime's optimiser), not the file as loaded;
    # the optimiser keeps the loaded graph only when its start-up timing says the candidate was
    # slower, which a loaded machine can make it say (never for any other reason here)
    opt = report["offline"]["optimization"]
    assert opt["method"] == "optimize_for_inference" or "was slower" in opt["reason"], opt
    for cfg, run in report["servers"].items():
        assert run["stop"]["exit_code"] == 0  # SIGTERM drains and exits 0
        assert run["start_to_ready_s"] > 0 and run["first_request_ms"] > 0
        for body in ("json", "binary"):
            levels = run["levels"][body]
            assert [lv["concurrency"] for lv in levels] == [1, 2]
            for lv in levels:
                assert lv["ok"] > 0 and not lv["errors"]
                assert lv["mean_batch"] >= 1
                ratio = summary["served_over_offline"][f"{cfg}/{body}"][str(lv["concurrency"])]
                assert ratio == pytest.approx(lv["items_per_s"] / best, abs=1e-3)
    assert "served / offline" in proc.stdout and "start->ready" in proc.stdout
    if shutil.which("wrk"):  # the wrk levels and the stage_timing on/off ratio
        wrk = report["servers"]["batching"]["wrk"]
        assert [lv["concurrency"] for lv in wrk["json"]] == [8, 32, 64]
        assert all(
            lv["rps"] > 0 and lv["non_2xx"] == 0 and lv["server_cpu_ms_per_req"] > 0
            for body in ("json", "binary")
            for lv in wrk[body]
        )
        inst = report["instrumentation"]
        assert inst["on_over_off"] == pytest.approx(
            inst["median_on"] / inst["median_off"], abs=1e-3
        )
